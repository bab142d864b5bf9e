"""Pure networks and their maths: the GLCIC completion network and context discriminator
(``networks.CompletionNetwork``, ``networks.ContextDiscriminator``, BN folding), the GAN losses and
image metrics (``losses``), and the seeded hole generators (``masks``: box, free-form, mixed).

No file I/O and no training state; every other stage builds on these modules.
"""
