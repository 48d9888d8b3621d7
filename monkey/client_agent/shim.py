"""The ``monkey`` a job imports on a worker (the agent installs this file as
``ROOT/jobcode/<agent digest>/python/monkey/__init__.py``, beside ``monkey_track.py``, a
copy of track.py, and puts that folder first on the job's PYTHONPATH).

The job's own ``monkey`` wins: when the rest of the job's import path holds one (monkey
installed in the job's environment, any version, or an unrelated module of that name),
that one is loaded in this one's place, exactly as if this folder were not there. Only
when there is none does ``import monkey`` give the in-job API (``log``, ``log_params``,
``summary``, ``flush``, ``checkpoint_dir``, ``preempted``) from ``monkey_track``, which
a job can always import by that name.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _own_spec():
    """The spec of a ``monkey`` the job's import path holds besides this folder, or None."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find("monkey", rest if finder is importlib.machinery.PathFinder else None)
        except Exception:  # a broken finder of the environment's: it has no monkey for us
            continue
        if spec is not None and spec.origin not in (None, "namespace"):
            return spec  # a bare folder named monkey (a namespace) does not count
    return None


_spec = _own_spec()
if _spec is not None:
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[__name__] = _module  # the import statement returns what is there at the end
    try:
        _spec.loader.exec_module(_module)
    except BaseException:
        del sys.modules[__name__]
        raise
else:
    from monkey_track import *  # noqa: F403
    from monkey_track import __all__  # noqa: F401

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"monkey.{name} is not available in a job on this worker: only the in-job API "
            f"({', '.join(__all__)}) is, as monkey is not installed in the job's environment"
        )
