"""The demo's checks, on made-up logs (the demo itself takes a minute: README)."""
import pytest


@pytest.fixture(scope='module')
def demo(load_tool):
    return load_tool('tools/run_demo.py')


def test_epoch_losses_average_each_epoch(demo):
    records = [dict(epoch=1, loss=7.0), dict(epoch=1, loss=6.0), dict(lr=0.1),
               dict(epoch=2, loss=5.0), dict(epoch=2, accuracy=1.0)]
    assert demo.epoch_losses(records) == {1: 6.5, 2: 5.0}


def test_loss_fell_compares_first_and_last_epoch(demo):
    # a rise in between is allowed: only the ends count
    assert demo.loss_fell('DINO', {1: 7.11, 4: 7.5, 10: 5.94}) == \
        'DINO loss: 7.11 (epoch 1) -> 5.94 (epoch 10)'
    for curve in ({1: 6.08, 10: 6.60}, {1: 5.0, 2: 5.0}):
        with pytest.raises(SystemExit, match='DINO loss did not decrease'):
            demo.loss_fell('DINO', curve)
    with pytest.raises(SystemExit, match='no probe loss was logged'):
        demo.loss_fell('probe', {})


def test_comparison_table_and_verdict(demo):
    from mmdinomamba.evaluation import BootstrapCI
    rows = [('k-NN top-1', BootstrapCI(0.30, 0.25, 0.35, 256),
             BootstrapCI(0.42, 0.36, 0.48, 256)),
            ('Binary-AUC', BootstrapCI(0.49, 0.48, 0.50, 256),
             BootstrapCI(0.49, 0.47, 0.51, 256))]
    table = demo.format_comparison(rows).splitlines()
    assert 'random init' in table[0] and 'DINO teacher' in table[0]
    assert '0.300 [0.250, 0.350]' in table[1] and '0.420 [0.360, 0.480]' in table[1]
    # a tie is not a win: the demo must fail on Binary-AUC here
    assert demo.not_beaten(rows) == ['Binary-AUC']
    assert demo.not_beaten(rows[:1]) == []
