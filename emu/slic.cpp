// slic: being written
