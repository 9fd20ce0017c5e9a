"""Writing a file at a name others can predict (run.json, progress.json, curves.png) without ever writing
through a link planted there, and whole or not at all. Standard library only: the launcher's watcher uses
it too. (csrc/core/files.c does the same for the files C writes.)"""
import contextlib
import errno
import os
import secrets


@contextlib.contextmanager
def replacing(path, mode="w"):
    """A new file whose contents replace `path` when the block ends (and vanish if it raises).

    The file is made next to `path` at a name no one can guess, by us (O_EXCL) and not through a link
    (O_NOFOLLOW), then renamed over `path`: a link planted at a predictable name (run.rank3.json, or a
    temporary one) is replaced, never written through. OSError when it cannot be made or renamed.
    """
    path = os.fspath(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = f"{path}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no free name for a temporary file beside it", path)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        try:
            os.replace(tmp, path)
        except OSError as e:   # about `path` (a directory there, say), not the temporary's name
            raise type(e)(e.errno, e.strerror, path) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
