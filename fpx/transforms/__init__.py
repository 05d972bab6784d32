"""The transforms' implementations, one module or package each: ``fpx.interval``,
``fpx.stochastic``, ``fpx.trace`` and ``fpx.classify`` are the functions; ``fpx.transforms.interval``
(a package), ``fpx.transforms.stochastic``, ``fpx.transforms.trace`` and
``fpx.transforms.classify`` the modules that implement them."""
