"""The benchmark's light constants: what the command line offers before torch loads.

Model names are not here: they are :data:`mmdinomamba.zoo.BACKBONES` (resolved by
:func:`benchmarks.common.model_name` once the arguments are parsed), the variants
of :data:`VARIANTS`, and the external baselines of :data:`benchmarks.common.BASELINES`.
"""
import os.path as osp

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
# The repository's configs/, found from this file's place in the checkout
# (``dino-step --config-dir`` points elsewhere)
CONFIG_DIR = osp.join(REPO, 'configs', 'dino')
SIZES = ('tiny', 'small', 'base')
# the model every ratio refers to (models, loop and dino-step modes)
BASELINE = 'vit-base'
DINO_BASELINE = 'vit-base'
# a benchmark-only model name is a zoo name with one of these suffixes: a slow
# twin or a run mode of the same model, the same numbers (model type: suffix -> spec
# keys). '-loop': DinoVim's blocks called one at a time (DinoVim.loop_blocks);
# '-rope-per-call': every MLLA mixer call builds its RoPE table (the stages'
# share_rope_table off); '-graphed': MLLA's stages replayed from CUDA graphs, as
# CUDAGraphBlocksHook sets them
VARIANTS = {
    'DinoVim': {'-loop': dict(stack_runner='loop')},
    'MLLA': {'-rope-per-call': dict(rope_tables='per-call'),
             '-graphed': dict(stage_graphs=True)},
}
# The shipped DINO pretraining configs by name, as files of a config directory
DINO_CONFIGS = {
    name: f'dino_{name}-p16_4xb48-amp-100e_in1k.py'
    for name in ('dinovim-tiny', 'dinovim-small', 'dinovim-base', 'dinomamba-reg-base',
                 'linearvit-base', 'vit-base')
}
# ImageNet classification configs by name (the training loop's ``--task cls``):
# ours, and mmpretrain's own for the baselines (``pkg::path``, read from the
# installed package)
CLS_CONFIGS = {
    'vit-base': 'mmpretrain::vision_transformer/vit-base-p16_64xb64_in1k.py',
    'swin-tiny': 'mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py',
    **{f'mlla-{a}': osp.join(REPO, 'configs', 'mlla', f'mlla-{a}_32xb128-300e_in1k.py')
       for a in SIZES},
}
# --amp: the torch dtype's name (None: no autocast)
AMP_DTYPES = {'bf16': 'bfloat16', 'fp16': 'float16', 'none': None}
DROP_PATH_RATE = 0.1
COMPILE_MODES = ['default', 'reduce-overhead', 'max-autotune',
                 'max-autotune-no-cudagraphs']
COMPILE_SCOPES = ('model', 'blocks')
# the host mode's kernel launch paths: the package's fast launcher, Triton's own
LAUNCHES = ('fast', 'triton')
# the loop mode's tasks, and a model name's suffix there: compiled (CompileModulesHook)
TASKS = ('cls', 'dino')
COMPILED = '+compile'
