// train: being written
