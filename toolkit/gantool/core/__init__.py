"""The ground every stage stands on: errors, enumerations and defaults, configs, atomic file I/O,
the export-folder table and the pixel contract.

Nothing here imports another gantool subpackage. Public: ``errors.GantoolError`` (and its kinds),
``constants`` (every enumeration and default, defined once), ``config.ModelConfig`` /
``config.TrainConfig``, ``fileio.atomic_write_bytes`` and friends, ``artifacts.ARTIFACTS`` (file
names, kinds, metadata keys) and ``processing`` (pre/post-processing shared by training and inference).
"""
