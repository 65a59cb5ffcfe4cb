// updates: being written
