"""The miniature world's training stages, one module each; the driver is :mod:`pipeline.demo.train_world`."""
