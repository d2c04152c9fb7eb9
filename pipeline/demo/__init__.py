"""The demo world: small local components that run the real loading code offline."""
