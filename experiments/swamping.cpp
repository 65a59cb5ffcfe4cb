// swamping: being written
