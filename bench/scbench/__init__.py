"""The benchmark's pieces: ``common`` (harness, statistics, raw I/O), one module per section (``throughput``,
``snapshot``, ``end_to_end``), ``report`` (tables and targets) and ``plots``. ``bench/sc_bench.py`` runs them."""
