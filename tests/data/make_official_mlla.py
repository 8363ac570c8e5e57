"""Make ``tests/data/official_mlla_small.pt`` from the official MLLA code.

The official code is read from the user's own checkout of github LeapLabTHU/MLLA
(``models/mlla.py``); nothing of it is copied into this repository. It needs timm
(the official file imports ``timm.models.layers``; 0.4.12 was used)::

    git clone https://github.com/LeapLabTHU/MLLA /tmp/MLLA
    git -C /tmp/MLLA checkout 66b6d29
    pip install timm==0.4.12
    python tests/data/make_official_mlla.py /tmp/MLLA

What the file holds and why: ``tests/data/README.md``. Everything runs on the CPU in
float32 (and once more in float64), in eval mode, from fixed seeds, so two runs on
the same torch version write the same tensors.
"""
import argparse
import copy
import importlib.util
import os.path as osp
import subprocess
import sys

DATA = osp.dirname(osp.abspath(__file__))
# the small model: 4 stages 12/24/48/96 wide, 3 heads in the first two stages (a
# RoPE row/column boundary inside a head, as in MLLA-B's first stage)
CONFIG = dict(img_size=64, patch_size=4, in_chans=3, num_classes=10, embed_dim=12,
              depths=[1, 1, 2, 1], num_heads=[3, 3, 6, 12], mlp_ratio=4.0,
              qkv_bias=True, drop_rate=0.0, drop_path_rate=0.0, ape=False,
              use_checkpoint=False)
SIZES = (64, 96)
BATCH = 2
MODEL_SEED, NOISE_SEED, INPUT_SEED = 0, 0, 1234
PERTURBATION = ('params += std*randn (torch.Generator seed 0, named_parameters order), '
                'std = 2/sqrt(fan_in) for attn.qk.weight, 0.5/sqrt(fan_in) for other '
                'weights of dim >= 2, 0.1 for 1-d tensors; BatchNorm running_mean = '
                '0.05*randn, running_var = 1 + 0.2*rand; rope.rotations buffers as '
                'constructed')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('official', help='a checkout of github LeapLabTHU/MLLA '
                        '(the folder holding models/mlla.py)')
    parser.add_argument('--out', default=osp.join(DATA, 'official_mlla_small.pt'),
                        help='where to write (default: %(default)s)')
    return parser.parse_args(argv)


def load_official(root: str):
    """The official ``models/mlla.py`` as a module (its ``MLLA`` class)."""
    path = osp.join(root, 'models', 'mlla.py')
    if not osp.isfile(path):
        raise SystemExit(f'error: {path} not found: pass a checkout of '
                         'github LeapLabTHU/MLLA')
    try:
        import timm.models.layers  # noqa: F401
    except ImportError:
        raise SystemExit('error: the official models/mlla.py imports timm: '
                         'pip install timm==0.4.12')
    spec = importlib.util.spec_from_file_location('official_mlla', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def commit_of(root: str) -> str:
    """The checkout's commit (``git rev-parse HEAD``), or 'unknown'."""
    try:
        return subprocess.run(['git', '-C', root, 'rev-parse', 'HEAD'], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return 'unknown'


def perturb(model, torch):
    """Move every parameter well away from its initialisation (:data:`PERTURBATION`)
    and give the BatchNorms non-trivial running statistics."""
    gen = torch.Generator().manual_seed(NOISE_SEED)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                fan_in = param[0].numel()
                scale = 2.0 if name.endswith('attn.qk.weight') else 0.5
                std = scale / fan_in ** 0.5
            else:
                std = 0.1
            param.add_(std * torch.randn(param.shape, generator=gen))
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.copy_(
                    0.05 * torch.randn(module.running_mean.shape, generator=gen))
                module.running_var.copy_(
                    1 + 0.2 * torch.rand(module.running_var.shape, generator=gen))


def record(model, x, torch):
    """The forward of ``model`` on ``x`` with every intermediate the tests compare."""
    # (a hook that returns something replaces the module's output: these return None)
    seen = {'blocks': {}, 'attn': {}, 'layers': [], 'stem': None}
    hooks = [model.patch_embed.register_forward_hook(
        lambda m, i, o: seen.__setitem__('stem', o.detach().clone()))]
    for i, layer in enumerate(model.layers):
        hooks.append(layer.register_forward_hook(
            lambda m, inp, out: seen['layers'].append(out.detach().clone())))
        for j, block in enumerate(layer.blocks):
            key = f'layers.{i}.blocks.{j}'
            hooks.append(block.register_forward_hook(
                lambda m, inp, out, key=key: seen['blocks'].__setitem__(
                    key, out.detach().clone())))
            hooks.append(block.attn.register_forward_hook(
                lambda m, inp, out, key=key: seen['attn'].__setitem__(
                    key, (inp[0].detach().clone(), out.detach().clone()))))
    with torch.no_grad():
        features = model.forward_features(x)
        output = model.head(features)
    for hook in hooks:
        hook.remove()
    last = [f'layers.{i}.blocks.{len(layer.blocks) - 1}'
            for i, layer in enumerate(model.layers)]
    return dict(output=output, features=features, stem_output=seen['stem'],
                stage_outputs=[seen['blocks'][k] for k in last],
                layer_outputs=seen['layers'], block_outputs=seen['blocks'],
                attn_inputs={k: v[0] for k, v in seen['attn'].items()},
                attn_outputs={k: v[1] for k, v in seen['attn'].items()})


def main(argv=None):
    args = parse_args(argv)
    import timm
    import torch
    official = load_official(args.official)
    torch.manual_seed(MODEL_SEED)
    base = official.MLLA(**CONFIG).eval()
    perturb(base, torch)
    state = {k: v.detach().clone() for k, v in base.state_dict().items()}
    gen = torch.Generator().manual_seed(INPUT_SEED)
    cases = []
    for size in SIZES:
        x = torch.randn(BATCH, 3, size, size, generator=gen)
        if size == CONFIG['img_size']:
            model, rebuilt = base, False
        else:  # the official model only takes the size it was built for
            model = official.MLLA(**dict(CONFIG, img_size=size)).eval()
            kept = {k: v for k, v in state.items() if not k.endswith('rope.rotations')}
            missing, unexpected = model.load_state_dict(kept, strict=False)
            assert not unexpected and all(k.endswith('rope.rotations') for k in missing)
            rebuilt = True
        case = dict(img_size=size, input=x, config_overrides=dict(img_size=size),
                    rope_rotations_rebuilt=rebuilt, **record(model, x, torch))
        wide = record(copy.deepcopy(model).double(), x.double(), torch)
        case.update(output_fp64=wide['output'], features_fp64=wide['features'],
                    stage_outputs_fp64=wide['stage_outputs'])
        cases.append(case)
    meta = dict(official_repo='github LeapLabTHU/MLLA',
                official_commit=commit_of(args.official), official_file='models/mlla.py',
                official_class='MLLA', torch=str(torch.__version__),
                timm=str(timm.__version__),
                device='cpu', dtype='float32', perturbation=PERTURBATION,
                model_seed=MODEL_SEED, input_seed=INPUT_SEED, mode='eval',
                script='tests/data/make_official_mlla.py')
    out = osp.abspath(args.out)
    from mmdinomamba.utils import save_atomic  # nothing half-written on a failure
    save_atomic(dict(config=dict(CONFIG), state_dict=state, cases=cases, meta=meta), out)
    print(f'wrote {out} ({osp.getsize(out) / 2**20:.2f} MiB; official commit '
          f'{meta["official_commit"][:7]}, torch {torch.__version__}, timm '
          f'{timm.__version__})')


if __name__ == '__main__':
    sys.exit(main())
