"""What the tests share: the server harness, model repositories, traffic, scrapes, fake receivers, file systems."""
