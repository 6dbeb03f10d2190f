"""sc-app benchmarks (``bench/run``); ``bench.scbench`` holds the sections, reporting and plots."""
