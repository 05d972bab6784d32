"""The transforms' implementations, one package or module each (``fpx.interval`` is the
function; ``fpx.transforms.interval`` the package that implements it)."""
