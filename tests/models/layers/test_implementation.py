"""One choice of the layers' kernels: how the forward runs (``implementation()``), the kernels that selects, the
dynamic linears' one cost rule, and the one function every layer asks (``choose_kernel``)."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

from mmwf.models.layers import BilateralDynamicLinear, LinearDynamicLinear, implementation
from mmwf.models.layers.dynamic_dwconv import adaptive_avg_pool, per_sample_depthwise_conv
from mmwf.models.layers.dynamic_linear import product_cost
from mmwf.models.layers.implementation import KERNELS, choose_kernel, evaluation, kernel, recorded_kernels

CASES = [(where, order) for where in KERNELS for order in ('tokens', 'core')]


class Probe(torch.nn.Module):
    """Returns, as its output's value, the case (:data:`CASES`) it ran in: the implementation, and the order
    ``'auto'`` takes when the token order is the cheaper (a constant in traced, compiled and exported graphs), by
    costs from the input's size with ``sized``."""

    def __init__(self, sized=False):
        super().__init__()
        self.sized = sized

    def forward(self, x):
        n = x.shape[0] if self.sized else 1
        return x * 0 + CASES.index((implementation(), choose_kernel('product_order', costs=dict(tokens=n, core=n + 1))))


@pytest.mark.filterwarnings('ignore:`torch.jit.trace:FutureWarning')
def test_each_way_of_running_is_one_implementation():
    """Each way of running is its implementation; the cheaper order is taken wherever the sizes are known, and
    ``'core'`` (serving every size) where an exported graph's sizes are symbolic."""
    from torch.export import Dim
    x = torch.randn(2, 3)
    runs = {'eager': lambda p: p(x), 'traced': lambda p: torch.jit.trace(p, x, check_trace=False)(x),
            'compiled': lambda p: torch.compile(p, backend='eager')(x),
            'exported': lambda p: torch.export.export(p, (x,)).module()(x)}
    for where, run in runs.items():
        assert {CASES[int(v)] for v in run(Probe()).flatten()} == {(where, 'tokens')}
    for dims, order in ((None, 'tokens'), ({'x': {0: Dim('n', min=2, max=64)}}, 'core')):
        program = torch.export.export(Probe(sized=True), (x,), dynamic_shapes=dims).module()
        assert {CASES[int(v)] for v in program(torch.randn(2, 3)).flatten()} == {('exported', order)}


@pytest.mark.filterwarnings('ignore::DeprecationWarning')  # the TorchScript exporter's own notices
def test_the_torchscript_onnx_exporter_is_its_own_implementation(tmp_path):
    ort = pytest.importorskip('onnxruntime')
    x = torch.randn(2, 3)
    torch.onnx.export(Probe(), (x,), str(tmp_path / 'probe.onnx'), input_names=['x'], dynamo=False)
    out = ort.InferenceSession(str(tmp_path / 'probe.onnx')).run(None, {'x': x.numpy()})[0]
    assert {CASES[int(v)] for v in out.flatten()} == {('traced-onnx', 'tokens')}


class DepthwiseAndPool(torch.nn.Module):
    def forward(self, x, w):
        return per_sample_depthwise_conv(x, w), adaptive_avg_pool(x, 3)


class Calls(TorchFunctionMode):
    """The names of the torch functions called in it."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, '__name__', ''))
        return func(*args, **(kwargs or {}))


@pytest.mark.filterwarnings('ignore:`torch.jit.trace:FutureWarning')
def test_each_implementation_runs_its_kernels():
    """Eager CPU: a conv per sample and PyTorch's adaptive pooling; traced (FLOP counter): one grouped conv and
    PyTorch's pooling; compiled: no conv and no adaptive pooling (the shift-sum and the averaging matrices, generic
    in the batch and grid sizes); exported: one conv with B*C groups where the batch is static, and where it is
    dynamic one conv with C groups (the taps), and the averaging matrices."""
    from torch.export import Dim
    module, x, w = DepthwiseAndPool(), torch.randn(3, 4, 5, 7), torch.randn(3, 4, 3, 3)
    with Calls() as calls:
        module(x, w)
    assert calls.names.count('conv2d') == 3 and 'adaptive_avg_pool2d' in calls.names
    kinds = [n.kind() for n in torch.jit.trace(module, (x, w)).inlined_graph.nodes()]
    assert sum('conv' in k for k in kinds) == 1 and 'aten::adaptive_avg_pool2d' in kinds
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch.compile(module, backend=backend)(x, w)
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == 'call_function']
    assert targets and not [t for t in targets if 'conv' in t or 'adaptive' in t], targets
    batch = Dim('batch', min=1, max=64)
    for dynamic, groups in ((None, 3 * 4), ({'x': {0: batch}, 'w': {0: batch}}, 4)):
        nodes = torch.export.export(module, (x, w), dynamic_shapes=dynamic).graph_module.graph.nodes
        convs = [n for n in nodes if n.op == 'call_function' and 'conv' in str(n.target)]
        assert len(convs) == 1 and convs[0].args[-1] == groups, convs
        assert not [n for n in nodes if 'adaptive' in str(n.target)]


def test_the_eager_depthwise_conv_kernel_depends_on_the_device_and_autograd():
    assert kernel('depthwise_conv', torch.device('cpu')) == 'loop'
    assert kernel('depthwise_conv', torch.device('cpu'), autograd=True) == 'grouped'
    assert kernel('depthwise_conv', torch.device('cuda')) == 'grouped'
    assert kernel('depthwise_conv', torch.device('cuda'), autograd=True) == 'grouped'
    x, w = torch.randn(3, 4, 5, 7), torch.randn(3, 4, 3, 3, requires_grad=True)
    for grad, convs in ((True, 1), (False, 3)):
        with torch.set_grad_enabled(grad), Calls() as calls:
            per_sample_depthwise_conv(x, w)
        assert calls.names.count('conv2d') == convs
    assert kernel('adaptive_pool') == 'native'


def test_eager_cuda_pools_by_one_product_over_the_tokens():
    """The pooling kernel by device and autograd (a stand-in object carries the CUDA device): on CUDA one product
    over the tokens in inference and training, on the CPU PyTorch's op."""
    from types import SimpleNamespace

    from mmwf.models.layers.dynamic_dwconv import adaptive_pool_kernel

    def cuda_map(h, w, grad=False):
        return SimpleNamespace(device=torch.device('cuda'), shape=(8, 192, h, w), requires_grad=grad)
    assert adaptive_pool_kernel(cuda_map(14, 14)) == adaptive_pool_kernel(cuda_map(78, 78, grad=True)) == 'tokens'
    assert adaptive_pool_kernel(torch.randn(1, 2, 78, 78)) == 'native'  # the CPU
    assert adaptive_pool_kernel(torch.randn(1, 2, 78, 78), 'matrices') == 'matrices'  # a layer's explicit choice


def test_the_cost_rule():
    assert product_cost(2, 3, 4, 5) == 2 * 3 * 4 + 2 * 4 * 5  # ((2 x 3)(3 x 4))(4 x 5)
    assert product_cost(6, 7, 8) == 6 * 7 * 8
    def order(choice, tokens, core):
        return choose_kernel('product_order', choice, costs=dict(tokens=tokens, core=core))
    assert order('auto', 5, 5) == 'tokens' and order('auto', 6, 5) == 'core'
    assert order('tokens', 9, 1) == 'tokens' and order('core', 1, 9) == 'core'


def bilateral_costs(n):
    """Eq. 8 on n 2 x 2-pooled tokens, Cin 192 -> Cout 768 (WeightFormer-T's first MLP linear; r = 4: ri 48, ro 192):
    the release's order, n (ri Cin + ro Cout + Cin Cout), and the core's, n ri ro + Cin ri ro + Cin ro Cout."""
    return n * (48 * 192 + 192 * 768 + 192 * 768), n * 48 * 192 + 192 * 48 * 192 + 192 * 192 * 768


def correlation_costs(n):
    """Eq. 5 on n tokens, Cin = C = 768 -> Cout 192 (a = 768, b = 192): the token order, n (C a + C b + a b), and
    the correlation's, n C C + the cheaper of a C C + a C b and C C b + a C b."""
    a, c, b = 768, 768, 192
    return n * (c * a + c * b + a * b), n * c * c + min(a * c * c + a * c * b, c * c * b + a * c * b)


def chosen_orders(call):
    """The orders the dynamic linears take in ``call()``: the one function's answers for ``'product_order'``, and the
    order within a Bilateral update's form (``'dynamic_weight'``)."""
    with recorded_kernels() as chosen:
        call()
    return [kernel[1] if operation == 'dynamic_weight' else kernel for operation, _, kernel in chosen
            if operation in ('product_order', 'dynamic_weight')]


@pytest.mark.parametrize('make,hw,pooled,costs', [
    *[(lambda: BilateralDynamicLinear(192, 768), hw, True, bilateral_costs)
      for hw in [(4, 4), (14, 14), (20, 22), (40, 40)]],
    *[(lambda: LinearDynamicLinear(768, 192, pool=False), hw, False, correlation_costs) for hw in [(20, 30), (30, 30)]],
])
def test_auto_order_is_the_cheaper_by_the_counted_costs(make, hw, pooled, costs):
    """The order a layer takes with order='auto' when it forms a weight per sample, against its costs written out
    (the grids cover both sides of each crossing)."""
    layer = make()
    with torch.no_grad(), evaluation(layer, form='materialized'):
        chosen = chosen_orders(lambda: layer(torch.randn(1, hw[0] * hw[1], layer.in_features), hw))
    tokens, core = costs((hw[0] // 2) * (hw[1] // 2) if pooled else hw[0] * hw[1])
    assert chosen == ['tokens' if tokens <= core else 'core']


def bilateral_factored_costs(n, big_n):
    """Eq. 8 applied as factors to big_n tokens (n pooled), Cin 192 -> Cout 768, ri 48, ro 192: the token factors
    (rank n: (SiLU(A) w1)^T and SiLU(B) w2, their Gram matrix, the column norms, two thin products) and the core's
    (rank ri: w1^T shared, (SiLU(A)^T SiLU(B)) w2, w1 w1^T, the norms, two thin products)."""
    tokens = n * 48 * 192 + n * 192 * 768 + n * 192 * n + n * n * 768 + big_n * 192 * n + big_n * n * 768
    core = 48 * n * 192 + 48 * 192 * 768 + 48 * 192 * 48 + 48 * 48 * 768 + big_n * 192 * 48 + big_n * 48 * 768
    return tokens, core


@pytest.mark.parametrize('hw', [(4, 4), (14, 14), (16, 16), (20, 22)])
def test_factored_order_is_the_cheaper_by_the_counted_costs(hw):
    with torch.no_grad():
        layer = BilateralDynamicLinear(192, 768, form='factored')
        chosen = chosen_orders(lambda: layer(torch.randn(1, hw[0] * hw[1], 192), hw))
    tokens, core = bilateral_factored_costs((hw[0] // 2) * (hw[1] // 2), hw[0] * hw[1])
    assert chosen == ['tokens' if tokens <= core else 'core']


@pytest.mark.parametrize('hw,autograd', [((16, 16), False), ((16, 16), True), ((14, 14), False), ((14, 14), True),
                                         ((64, 64), False), ((64, 64), True)])
def test_weight_form_is_the_cheaper_by_the_counted_costs(hw, autograd):
    """Eager PyTorch applies a Bilateral update as factors unless forming the weight per sample costs fewer
    multiply-adds, charged 8 per element of each sample's weight and pass over it (3 passes in inference, 12 with
    autograd); the grids cover both sides in inference and in training (224 px and 1024 px for WeightFormer-T)."""
    n, big_n = (hw[0] // 2) * (hw[1] // 2), hw[0] * hw[1]
    factored = min(bilateral_factored_costs(n, big_n))
    materialized = min(bilateral_costs(n)) + 8 * (12 if autograd else 3) * 192 * 768
    layer = BilateralDynamicLinear(192, 768).requires_grad_(autograd)
    with Calls() as calls:
        layer(torch.randn(1, big_n, 192), hw)
    assert ('baddbmm' in calls.names) == (factored <= materialized)


def test_choices_are_held_by_the_layers_and_set_for_a_scope():
    """The kernel table is read-only; a scope sets the layers' choices and restores each layer's own."""
    from mmwf.models.backbones import WeightFormer
    with pytest.raises(TypeError):
        KERNELS['eager']['dynamic_weight'] = 'factored'
    model = WeightFormer(dict(embed_dims=32, depth=3, mlp_ratio=2), dynamic_blocks=[1],
                         dynamic_linear=dict(type='BilateralDynamicLinear', form='factored'))
    block = model.blocks[1]
    assert (block.linear1.form, block.linear1.order, block.dwc.conv) == ('factored', 'auto', 'auto')
    with evaluation(model, form='materialized', conv='taps', order='tokens'):
        assert (block.linear1.form, block.linear1.order, block.dwc.conv) == ('materialized', 'tokens', 'taps')
    assert (block.linear1.form, block.linear1.order, block.dwc.conv) == ('factored', 'auto', 'auto')
    with pytest.raises(ValueError,
                       match=r"conv='tap' is not one of \('auto', 'loop', 'grouped', 'taps', 'shift', 'triton'\)"):
        with evaluation(model, conv='tap'):
            pass
    with pytest.raises(ValueError, match="'speed' is not a layer choice"):
        with evaluation(model, speed='fast'):
            pass


def rule_module():
    """The module of the one rule (``mmwf.models.layers.implementation``; the package's name of it is the function
    ``implementation``)."""
    import sys
    return sys.modules[choose_kernel.__module__]


@pytest.mark.parametrize('where,conv,form', [('eager', 'triton', ('fused', 'tokens')),
                                             ('compiled', 'triton', ('fused', 'tokens')),
                                             ('traced', 'grouped', ('materialized', 'core')),
                                             ('traced-onnx', 'taps', ('materialized', 'core')),
                                             ('exported', 'grouped', ('materialized', 'core'))])
def test_triton_choices_give_way_to_the_table_in_graphs(monkeypatch, where, conv, form):
    """A layer's 'triton' and 'fused' hold in eager and compiled code; traced and exported graphs take their entry
    (the exported conv grouped for a static batch); a fused update orders by the factored form's costs, a formed
    weight by its own; other explicit choices are kept everywhere."""
    monkeypatch.setattr(rule_module(), 'implementation', lambda: where)
    cpu = torch.device('cpu')
    assert choose_kernel('depthwise_conv', 'triton', cpu, batch=2) == conv
    costs = dict(factored=dict(tokens=1, core=2), materialized=dict(tokens=5, core=3))
    assert choose_kernel('dynamic_weight', 'fused', cpu, costs=costs) == form
    assert choose_kernel('depthwise_conv', 'loop', cpu, autograd=True, batch=2) == 'loop'
    assert choose_kernel('dynamic_weight', 'factored', cpu, costs=costs, order='core') == ('factored', 'core')


def test_a_formed_weight_is_charged_its_passes_by_the_device():
    """WF-T's first Bilateral update at 224 (49 pooled of 196 tokens): forming the weight is charged 8 multiply-adds
    per element and pass on the CPU (3 passes, 12 with autograd) and nothing on CUDA, also when a CPU run counts for
    CUDA (``resolved_as``); each form in its cheaper order."""
    from mmwf.models.layers.implementation import resolved_as
    costs = BilateralDynamicLinear(192, 768).costs(49, 196)
    factored, materialized = min(bilateral_factored_costs(49, 196)), min(bilateral_costs(49))
    orders = {'factored': 'tokens' if bilateral_factored_costs(49, 196)[0] <= bilateral_factored_costs(49, 196)[1]
              else 'core', 'materialized': 'tokens' if bilateral_costs(49)[0] <= bilateral_costs(49)[1] else 'core'}
    forms = set()
    for device, charge in (('cpu', 8), ('cuda', 0)):
        for autograd, passes in ((False, 3), (True, 12)):
            form = 'factored' if factored <= materialized + charge * passes * 192 * 768 else 'materialized'
            chosen = choose_kernel('dynamic_weight', 'auto', torch.device(device), autograd, costs=costs,
                                   weight_elements=192 * 768)
            assert chosen == (form, orders[form]), (device, autograd)
            with resolved_as(device):
                assert choose_kernel('dynamic_weight', 'auto', torch.device('cpu'), autograd, costs=costs,
                                     weight_elements=192 * 768) == chosen
            forms.add(form)
    assert forms == {'factored', 'materialized'}  # the charge decides here


def test_the_outer_product_of_deep_is_the_cheaper():
    """Deep (eq. 7), Cin -> Cout with r1 = Cin / 4, r2 = Cout / 4: (W1 inner) W4 costs Cin r1 r2 + Cin r2 Cout,
    W1 (inner W4) costs Cout r2 r1 + Cout r1 Cin; the left one on a tie, an explicit choice kept."""
    from mmwf.models.layers import DeepDynamicLinear
    assert choose_kernel('outer_product', costs=dict(left=3, right=3)) == 'left'
    assert choose_kernel('outer_product', costs=dict(left=4, right=3)) == 'right'
    assert choose_kernel('outer_product', 'left', costs=dict(left=4, right=3)) == 'left'
    for cin, cout in ((192, 768), (768, 192)):
        r1, r2 = cin // 4, cout // 4
        left, right = cin * r1 * r2 + cin * r2 * cout, cout * r2 * r1 + cout * r1 * cin
        layer = DeepDynamicLinear(cin, cout)
        with torch.no_grad(), recorded_kernels() as chosen:
            layer(torch.randn(1, 16, cin), (4, 4))
        assert [k for op, _, k in chosen if op == 'outer_product'] == ['left' if left <= right else 'right']


def layer_cases():
    """(layer, the operations it asks the one function for with its choices as constructed) for every layer that
    chooses (the dynamic layers, a static conv set to the Triton kernel, TTT's conv head): a predictor without
    adaptive pooling (GAP) asks no pooling; a formed weight asks how it adds its update; a Bilateral update asks its
    form and order together."""
    from mmwf.models.layers import (
        AdaptiveDynamicDWConv,
        AmpDirDynamicDWConv,
        ConvDynamicDWConv,
        DeepDynamicLinear,
        GAPDynamicDWConv,
        GAPDynamicLinear,
        NonlinearDynamicLinear,
        StaticDWConv,
        TTTAttention,
    )
    return {
        'GAP linear': (GAPDynamicLinear(8, 16, update='div-add'), {('weight_update', 'div-add')}),
        'Linear': (LinearDynamicLinear(8, 16, order='core'), {('product_order', 'core'), ('weight_update', 'auto')}),
        'Nonlinear': (NonlinearDynamicLinear(8, 16), {('product_order', 'auto'), ('weight_update', 'auto')}),
        'Deep': (DeepDynamicLinear(8, 16, outer='right'),
                 {('product_order', 'auto'), ('outer_product', 'right'), ('weight_update', 'auto')}),
        'Bilateral, materialized': (BilateralDynamicLinear(8, 16, order='tokens', form='materialized'),
                                    {('dynamic_weight', ('materialized', 'tokens')), ('weight_update', 'auto')}),
        'Bilateral, factored': (BilateralDynamicLinear(8, 16, form='factored'),
                                {('dynamic_weight', ('factored', 'auto'))}),
        'GAP DWConv': (GAPDynamicDWConv(8, conv='taps'), {('depthwise_conv', 'taps')}),
        'Adaptive DWConv': (AdaptiveDynamicDWConv(8, pool='matrices'),
                            {('adaptive_pool', 'matrices'), ('depthwise_conv', 'auto')}),
        'AmpDir DWConv': (AmpDirDynamicDWConv(8), {('adaptive_pool', 'auto'), ('depthwise_conv', 'auto')}),
        'Conv DWConv': (ConvDynamicDWConv(8, conv='shift'), {('adaptive_pool', 'auto'), ('depthwise_conv', 'shift')}),
        'Static DWConv, triton': (StaticDWConv(8, conv='triton'), {('depthwise_conv', 'triton')}),
        'TTT attention': (TTTAttention(8, 2, conv='taps'), {('depthwise_conv', 'taps')}),
    }


@pytest.mark.parametrize('name', list(layer_cases()))
def test_every_layer_asks_the_one_function_with_its_own_choices(name):
    layer, asked = layer_cases()[name]
    with recorded_kernels() as chosen:
        layer(torch.randn(2, 6 * 5, 8), (6, 5))
    assert {(operation, choice) for operation, choice, _ in chosen} == asked


def test_recording_is_scoped_and_nests():
    with recorded_kernels() as outer:
        choose_kernel('weight_update')
        with recorded_kernels() as inner:
            choose_kernel('product_order', 'core', costs=dict(tokens=1, core=2))
        choose_kernel('outer_product', costs=dict(left=2, right=1))
    choose_kernel('weight_update')  # outside: not recorded
    assert inner == [('product_order', 'core', 'core')]
    assert outer == [('weight_update', 'auto', 'addcdiv'), ('outer_product', 'auto', 'right')]


def test_the_kernel_table_renders_each_implementation_device_and_autograd():
    """The markdown of docs/kernel_choice.md: eager splits by the device types its entries name (the CPU's conv by
    autograd), every other implementation is one row; cells read as the table's entries."""
    from mmwf.models.layers.implementation import kernel_table
    lines = kernel_table().splitlines()
    header = [c.strip() for c in lines[0].strip('|').split('|')]
    assert header[:4] == ['implementation', 'device', 'autograd', '`depthwise_conv` (`conv`)']
    rows = {tuple(c.strip() for c in line.strip('|').split('|')[:3]): [c.strip(' `') for c in line.strip(
        '|').split('|')[3:]] for line in lines[2:]}
    assert list(rows) == [('`eager`', '`cpu`', 'no'), ('`eager`', '`cpu`', 'yes'), ('`eager`', '`cuda`', 'either'),
                          ('`eager`', 'any other', 'either'), ('`traced`', 'any', 'either'),
                          ('`traced-onnx`', 'any', 'either'), ('`compiled`', 'any', 'either'),
                          ('`exported`', 'any', 'either')]
    assert rows['`eager`', '`cpu`', 'no'] == ['loop', 'native', 'cheaper', 'cheaper', 'addcdiv', 'cheaper']
    assert rows['`eager`', '`cpu`', 'yes'][0] == 'grouped' and rows['`eager`', '`cuda`', 'either'][1] == 'tokens'
    assert rows['`traced-onnx`', 'any', 'either'] == ['taps', 'matrices', 'cheaper', 'materialized', 'div-add',
                                                      'cheaper']
    assert rows['`exported`', 'any', 'either'][:3] == ['grouped-static', 'matrices', 'cheaper-static']


def test_a_block_fuses_across_its_modules_only_where_no_hook_watches():
    """A block's call fuses across its modules (the conv's shortcut, GELU in a kernel) without forward hooks, and
    overwrites fresh outputs only where autograd records nothing too."""
    from mmwf.models.backbones import WeightFormer
    from mmwf.models.layers.implementation import BlockFusion
    block = WeightFormer(dict(embed_dims=16, depth=2, mlp_ratio=2), dynamic_blocks=[1]).blocks[1]
    assert BlockFusion.of(block) == BlockFusion(across=True, inplace=False)
    with torch.no_grad():
        assert BlockFusion.of(block) == BlockFusion(across=True, inplace=True)
        handle = block.linear2.register_forward_hook(lambda *args: None)
        assert BlockFusion.of(block) == BlockFusion(across=False, inplace=False)
        handle.remove()
