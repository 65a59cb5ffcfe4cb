// datasets: being written
