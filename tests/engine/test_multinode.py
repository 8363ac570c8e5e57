"""Two nodes of one process each on localhost (gloo): the toy DINO config through
two ``torchrun --nnodes 2 --node-rank R`` launches meeting at one rendezvous
address, as docs/dino.md's multi-node launch runs on two machines."""
import os
import os.path as osp
import socket
import subprocess
import sys

import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_end_with_the_same_weights(toy_root, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    port = free_port()
    nodes = [subprocess.Popen(
        [sys.executable, '-m', 'torch.distributed.run', '--nnodes=2',
         f'--node-rank={rank}', '--nproc-per-node=1', '--master-addr=127.0.0.1',
         f'--master-port={port}', '-m', 'tests.helpers.dino_ddp_worker', toy_root,
         str(tmp_path)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)]
    outputs = []
    for node in nodes:
        try:
            outputs.append(node.communicate(timeout=300)[0])
        finally:
            if node.poll() is None:
                node.kill()
    assert [node.returncode for node in nodes] == [0, 0], \
        '\n'.join(out[-3000:] for out in outputs)
    states = [torch.load(tmp_path / f'state_rank{r}.pth', weights_only=True)
              for r in (0, 1)]
    assert [s['world_size'] for s in states] == [2, 2]
    assert states[0]['iter'] == states[1]['iter'] == 2  # 16 images / 2 nodes / 4
    # the ranks started from one seed and stepped with all-reduced gradients: the
    # parameters of the student, its head and the teacher (the EMA of the student)
    # end bit-equal (BatchNorm's running statistics are each process's own, as
    # on one machine with broadcast_buffers=False)
    weights = [s['parameters'] for s in states]
    assert weights[0].keys() == weights[1].keys() and len(weights[0]) > 10
    for key, value in weights[0].items():
        assert torch.equal(value, weights[1][key]), key
    assert torch.equal(states[0]['center'], states[1]['center'])
    assert states[0]['center'].abs().sum() > 0
