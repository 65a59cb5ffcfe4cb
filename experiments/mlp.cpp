// mlp: being written
