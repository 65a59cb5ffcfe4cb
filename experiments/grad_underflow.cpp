// grad_underflow: being written
