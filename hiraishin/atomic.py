"""Atomic file writes: a result file is either the old one or the whole new one, never half of one.

Every file the library writes for a user (GGUF models, plots, JSON reports) goes through
:func:`atomic_path` or :func:`atomic_write`: the bytes are written to a unique temporary name in
the destination's own folder (same file system, so the final ``os.replace`` is atomic), and the
temporary file is removed if the writer fails, is interrupted (``KeyboardInterrupt``) or the
process gets SIGTERM (see :func:`install_sigterm_cleanup`). Two processes writing the same path
each write their own temporary file; the last rename wins, whole.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_path", "atomic_write", "install_sigterm_cleanup", "cleanup_partial_files", "TEMP_SUFFIX"]

# Temporary files are named ``.<final name>.<random>.partial`` beside the destination.
TEMP_SUFFIX = ".partial"

# Permission bits open(path, "w") asks for (before the umask).
_DEFAULT_MODE = 0o666

_live: set[str] = set()  # temporary files of writes in progress (removed on SIGTERM)
_live_lock = threading.Lock()


def _current_umask() -> int:
    mask = os.umask(0o022)  # the only way to read the umask is to set it
    os.umask(mask)
    return mask


def cleanup_partial_files() -> None:
    """Remove the temporary files of every atomic write in progress."""
    with _live_lock:
        paths = list(_live)
        _live.clear()
    for p in paths:
        with contextlib.suppress(OSError):
            os.unlink(p)


def install_sigterm_cleanup() -> None:
    """On SIGTERM, remove the temporary files of writes in progress, then exit as SIGTERM would.

    Installed by the command line (main thread only); a library user who handles SIGTERM
    themselves can call :func:`cleanup_partial_files` from their own handler instead.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        cleanup_partial_files()
        if callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN):
            previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s new content to; rename it over ``path`` on success.

    For writers that take a file name (``GGUFWriter``, ``matplotlib.savefig``): write the whole
    file to the yielded path. On any exception (``KeyboardInterrupt`` included) the temporary file
    is removed and ``path`` is left as it was.
    """
    final = Path(path)
    folder = final.parent if str(final.parent) else Path(".")
    if not folder.is_dir():
        raise FileNotFoundError(f"{final}: folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=TEMP_SUFFIX, dir=folder)
    try:
        # mkstemp creates the file 0600; give the result the permissions open() would have given it.
        os.fchmod(fd, _DEFAULT_MODE & ~_current_umask())
    finally:
        os.close(fd)
    with _live_lock:
        _live.add(tmp)
    try:
        yield Path(tmp)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        with _live_lock:
            _live.discard(tmp)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w", encoding: str | None = "utf-8"):
    """``open()`` for writing, atomically: ``with atomic_write("out.json") as f: json.dump(x, f)``.

    The file is flushed and fsync'ed before the rename, so a completed write survives a crash.
    """
    if "w" not in mode:
        raise ValueError(f"atomic_write writes whole files; mode must contain 'w', got {mode!r}")
    with atomic_path(path) as tmp:
        kwargs = {} if "b" in mode else {"encoding": encoding}
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
