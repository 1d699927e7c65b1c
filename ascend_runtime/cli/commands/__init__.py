"""Sub-command modules of `ascend-deploy`; each defines ``register(subparsers)``."""
