// summation: being written
