"""What the handle-owning classes (Optimizer, Comm) share: close() releases the native
handle kept in ``self._handle``; ``closed``, use as a context manager, and release when
garbage collected follow from it."""


class OwnsHandle:
    """Mixin: the class sets ``self._handle`` and defines ``close()``, which releases it,
    sets it to None and is a no-op the second time."""

    _handle = None

    @property
    def closed(self):
        """True after :meth:`close`."""
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        if getattr(self, "_handle", None) is not None:
            try:
                self.close()
            except Exception:  # interpreter shutdown may have torn the module down already
                pass
