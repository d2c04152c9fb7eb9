"""Run-time plumbing of long commands: progress lines, stopping on signals, crash bookkeeping and fault injection, the checkout's paths, cluster job submission."""
