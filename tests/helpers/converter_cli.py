"""What the model converters' tests check of a refused file."""
import os.path as osp
from typing import Iterable

import pytest


def assert_refused(tool, src: str, dst: str, capsys, messages: Iterable[str]) -> str:
    """``tool.main([src, dst])`` exits non-zero, its stderr holds every one of
    ``messages``, and ``dst`` is not written; returns the stderr."""
    with pytest.raises(SystemExit) as exit_info:
        tool.main([src, dst])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    for message in messages:
        assert message in err, (message, err)
    assert not osp.exists(dst)
    return err
