"""Leaf helpers every layer may use: safe checkpoint and config loading, atomic
writes.

They depend on torch, numpy and mmengine only, and import nothing else of the
package.
"""
from .io import dump_atomic, save_atomic, write_atomic, write_text_atomic
from .safe_config import (UnsafeConfigError, checkpoint_config, config_from_text,
                          read_checkpoint_configs_as_data)
from .safe_load import (InertRecord, UnsafeCheckpointError,
                        allow_mmengine_checkpoint_types, checkpoint_safe_globals,
                        load_checkpoint_file, load_official_checkpoint)

__all__ = ['InertRecord', 'UnsafeCheckpointError', 'UnsafeConfigError',
           'allow_mmengine_checkpoint_types', 'checkpoint_config',
           'checkpoint_safe_globals', 'config_from_text', 'dump_atomic',
           'load_checkpoint_file', 'load_official_checkpoint',
           'read_checkpoint_configs_as_data', 'save_atomic', 'write_atomic',
           'write_text_atomic']
