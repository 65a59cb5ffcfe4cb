// matmul_accum: being written
