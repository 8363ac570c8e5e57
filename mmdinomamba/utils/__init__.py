"""Leaf helpers every layer may use: safe checkpoint loading and atomic writes.

They depend on torch, numpy and mmengine only, and import nothing else of the
package.
"""
from .io import dump_atomic, save_atomic, write_atomic, write_text_atomic
from .safe_load import (InertRecord, UnsafeCheckpointError,
                        allow_mmengine_checkpoint_types, checkpoint_safe_globals,
                        load_checkpoint_file, load_official_checkpoint)

__all__ = ['InertRecord', 'UnsafeCheckpointError', 'allow_mmengine_checkpoint_types',
           'checkpoint_safe_globals', 'dump_atomic', 'load_checkpoint_file',
           'load_official_checkpoint', 'save_atomic', 'write_atomic',
           'write_text_atomic']
