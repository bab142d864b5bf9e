"""Everything ``gantool train`` and ``gantool runs`` do: the image data and per-step sampler
(``data``), the phased loop with its step functions (``loop.train``, ``loop.discriminator_step``,
``loop.generator_step``), checkpoints (``checkpoint.save_checkpoint`` / ``load_checkpoint``), run
folders and resume rules (``runfolder``), what a run reports (``tracking``), run listings (``runs``)
and DDP set-up (``distributed``).
"""
