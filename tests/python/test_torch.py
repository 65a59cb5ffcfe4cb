"""roundoff.torch: tensors, emulated nn.Linear/nn.Conv2d against roundoff.matmul, float64
autograd, determinism, exception counts and traps, bad input.

Cost: small shapes throughout; about 10 s on one core, most of it importing torch and
the 20-step training runs."""
import copy
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="roundoff.torch needs python3-torch (scripts/setup --torch)")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import roundoff  # noqa: E402
import roundoff.torch as rt  # noqa: E402

# Every unit with its input formats: b200's block-scaled MMA with an MX and the NVFP4 format.
UNITS = [(u, None) for u in roundoff.units()] + [("b200", "mxfp8-e4m3"), ("b200", "nvfp4")]


def test_import_without_torch_names_the_setup_command():
    code = ("import sys; sys.modules['torch'] = None; import roundoff\n"
            "try:\n    import roundoff.torch\nexcept ImportError as e:\n    print(e)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "scripts/setup --torch" in done.stdout


# ---- round and quantize ------------------------------------------------------------

def test_round_is_roundoff_round_on_the_tensor():
    x = torch.randn(3, 5) * 100
    y, flags = rt.round(x, "fp8-e4m3", "sr", seed=4)
    ref, ref_flags = roundoff.round(x.numpy(), "fp8-e4m3", "sr", seed=4)
    assert y.dtype == torch.float32 and np.array_equal(y.numpy(), ref) and flags == ref_flags


@pytest.mark.parametrize("dtype,format", [(torch.float16, "fp16"), (torch.bfloat16, "bf16")])
def test_half_tensors_round_trip_their_own_bits(dtype, format):
    bits = torch.arange(-32768, 32768, 97, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype)
    x = x[~torch.isnan(x)]
    y, _ = rt.round(x, format)
    assert y.dtype == dtype and torch.equal(y.view(torch.int16), x.view(torch.int16))


def test_round_keeps_wider_results_wide_and_refuses_what_roundoff_round_refuses():
    y, _ = rt.round(torch.tensor([0.1], dtype=torch.bfloat16), "fp16")
    assert y.dtype == torch.float32
    with pytest.raises(ValueError) as ours:
        rt.round(torch.ones(2), "fp7")
    with pytest.raises(ValueError) as theirs:
        roundoff.round(np.ones(2), "fp7")
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(TypeError, match="meta"):
        rt.round(torch.empty(2, device="meta"), "fp16")
    with pytest.raises(TypeError, match="int64"):
        rt.round(torch.ones(2, dtype=torch.int64), "fp16")


def test_quantize_passes_the_gradient_through_or_rounds_it():
    x = torch.tensor([0.1, 1000.0], requires_grad=True)
    y = rt.quantize(x, "fp8-e5m2")
    assert torch.equal(y, rt.round(x, "fp8-e5m2")[0])
    y.backward(torch.tensor([0.3, 0.7]))
    assert torch.equal(x.grad, torch.tensor([0.3, 0.7]))
    x.grad = None
    rt.quantize(x, "fp8-e5m2", grad_format="fp8-e4m3").backward(torch.tensor([0.3, 0.7]))
    assert torch.equal(x.grad, rt.round(torch.tensor([0.3, 0.7]), "fp8-e4m3")[0])
    with pytest.raises(ValueError, match="grad_format fp32"):
        rt.quantize(x.to(torch.bfloat16), "bf16", grad_format="fp32")


# ---- emulated layers against roundoff.matmul ----------------------------------------

def _matmul(A, B, C=None, **options):
    value, _ = roundoff.matmul(np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64),
                               None if C is None else np.asarray(C, dtype=np.float64), **options)
    return np.asarray(value, dtype=np.float32)


def _backward_options(options, grad_in_format, gradient):
    """roundoff.matmul's options for a backward GEMM whose operand `gradient` ("A", "B")
    is the gradient: with grad_in_format, the mixed inputs it and in_format make."""
    if grad_in_format is None:
        return options
    a, b = (grad_in_format, options["in_format"]) if gradient == "A" else (options["in_format"], grad_in_format)
    return dict(options, in_format=a if a == b else f"{a}:{b}")


def _linear_gemms_against_matmul(unit, in_format, grad_in_format=None, grad_scale=1.0, **unit_options):
    torch.manual_seed(1)
    layer = nn.Linear(40, 6)
    x = torch.randn(2, 3, 40, requires_grad=True)
    grad = torch.randn(2, 3, 6) * grad_scale
    rounding = "sr" if unit.startswith("ipu") else "rne"
    rt.emulate(layer, unit=unit, in_format=in_format, grad_in_format=grad_in_format, rounding=rounding, seed=9,
               **unit_options)
    y = layer(x)
    y.backward(grad)
    options = dict(unit=unit, in_format=in_format, rounding=rounding, **unit_options)
    backward = _backward_options(options, grad_in_format, "A")  # the gradient is A in both
    seed = lambda op: rt.layer_seed(9, "", op, 0)  # noqa: E731
    x2, g2, w = x.detach().reshape(6, 40).numpy(), grad.reshape(6, 6).numpy(), layer.weight.detach().numpy()
    C = np.broadcast_to(layer.bias.detach().numpy(), (6, 6))
    np.testing.assert_array_equal(y.detach().reshape(6, 6).numpy(),
                                  _matmul(x2, w.T, C, seed=seed("forward"), **options))
    np.testing.assert_array_equal(x.grad.reshape(6, 40).numpy(), _matmul(g2, w, seed=seed("backward.input"), **backward))
    np.testing.assert_array_equal(layer.weight.grad.numpy(), _matmul(g2.T, x2, seed=seed("backward.weight"), **backward))
    return x.grad, layer.weight.grad
    assert torch.equal(layer.bias.grad, grad.reshape(6, 6).sum(0))  # float32, as torch sums it


@pytest.mark.parametrize("unit,in_format", UNITS)
def test_linear_gemms_equal_roundoff_matmul(unit, in_format):
    _linear_gemms_against_matmul(unit, in_format)


HYBRID = dict(unit="mi300x", in_format="fp8-e4m3fnuz", grad_in_format="fp8-e5m2fnuz")


def test_hybrid_fp8_takes_the_gradient_in_grad_in_format_in_both_backward_gemms():
    # FP8 training's hybrid recipe on mi300x: e4m3 forward; the backward GEMMs take the
    # gradient (A in both of Linear's) in e5m2: in_format fp8-e5m2fnuz:fp8-e4m3fnuz.
    # Gradients of 2^-12 or so lie below e4m3fnuz's subnormals (2^-10) and within
    # e5m2fnuz's range: the e4m3-only emulation loses them, the hybrid one keeps them.
    hybrid = _linear_gemms_against_matmul(grad_scale=2.0 ** -12, **HYBRID)
    e4m3_only = _linear_gemms_against_matmul("mi300x", "fp8-e4m3fnuz", grad_scale=2.0 ** -12)
    for ours, theirs in zip(hybrid, e4m3_only):
        assert ours.abs().sum() > 0 and not torch.equal(ours, theirs)
    # grad_in_format equal to the forward's is the forward's unit: no pair.
    same = _linear_gemms_against_matmul("mi300x", "fp8-e4m3fnuz", grad_in_format="fp8-e4m3fnuz", grad_scale=2.0 ** -12)
    assert all(torch.equal(a, b) for a, b in zip(same, e4m3_only))


def test_grad_in_format_on_a_unit_without_mixed_inputs_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"grad_in_format='fp8-e5m2'.*mixed inputs.*mi300x"):
        rt.emulate(nn.Linear(2, 2), unit="h100", in_format="fp8-e4m3", grad_in_format="fp8-e5m2")
    with pytest.raises(ValueError, match=r"grad_in_format='fp16'.*fp8-e5m2fnuz"):
        rt.emulate(nn.Linear(2, 2), unit="mi300x", in_format="fp8-e4m3fnuz", grad_in_format="fp16")


# A reference unit on a block format's dequantised values; scale rules ("up" is not
# nvfp4's default, so a rule left out would show).
@pytest.mark.parametrize("unit,in_format,scale_rule", [
    ("exact", "mxfp8-e4m3", None), ("fp16-seq", "mxfp4-e2m1", "even"), ("fp32-seq", "nvfp4", None),
    ("b200", "nvfp4", "nearest"), ("b200", "nvfp4", "up")])
def test_block_formats_and_scale_rules_equal_roundoff_matmul(unit, in_format, scale_rule):
    _linear_gemms_against_matmul(unit, in_format, scale_rule=scale_rule)


@pytest.mark.parametrize("unit,in_format", [("h100", None), ("exact", "mxfp8-e4m3"), ("b200", "nvfp4")])
def test_an_empty_batch_gives_empty_outputs_and_gradients(unit, in_format):
    layer = rt.emulate(nn.Linear(40, 6), unit=unit, in_format=in_format)
    x = torch.randn(0, 40, requires_grad=True)
    y = layer(x)
    y.backward(torch.ones(0, 6))
    assert y.shape == (0, 6) and x.grad.shape == (0, 40)
    assert torch.equal(layer.weight.grad, torch.zeros(6, 40)) and torch.equal(layer.bias.grad, torch.zeros(6))


CONVS = [dict(stride=1, padding=0), dict(stride=2, padding=1, dilation=2), dict(stride=(1, 2), padding=(2, 0)),
         dict(stride=1, padding=1, groups=2), dict(stride=1, padding="same", groups=4)]


@pytest.mark.parametrize("unit,in_format,grad_in_format", [("h100", None, None), ("ipu-amp", None, None),
                                                           ("b200", "mxfp8-e4m3", None), tuple(HYBRID.values())])
@pytest.mark.parametrize("geometry", CONVS)
def test_conv2d_equals_its_im2col_gemm(unit, in_format, grad_in_format, geometry):
    torch.manual_seed(2)
    conv = nn.Conv2d(4, 6 if geometry.get("groups", 1) != 4 else 4, 3, **geometry)
    x = torch.randn(2, 4, 7, 6, requires_grad=True)
    reference = F.conv2d(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation, conv.groups)
    rounding = "sr" if unit == "ipu-amp" else "rne"
    rt.emulate(conv, unit=unit, in_format=in_format, grad_in_format=grad_in_format, rounding=rounding, seed=5)
    y = conv(x)
    assert y.shape == reference.shape
    grad = torch.randn(y.shape)
    y.backward(grad)
    # The im2col GEMMs, group by group: weight.reshape(out, -1) times unfold's columns.
    pad = conv._reversed_padding_repeated_twice
    cols = F.unfold(F.pad(x.detach(), pad), conv.kernel_size, dilation=conv.dilation, stride=conv.stride)
    n, k, positions = cols.shape
    groups, out_channels = conv.groups, conv.out_channels
    w2 = conv.weight.detach().reshape(out_channels, -1).numpy()
    B = cols.permute(1, 0, 2).reshape(k, n * positions).numpy()  # columns (image, position)
    G = grad.reshape(n, out_channels, positions).permute(1, 0, 2).reshape(out_channels, -1).numpy()
    og, kg = out_channels // groups, k // groups
    y_cols = y.detach().reshape(n, out_channels, positions).permute(1, 0, 2).reshape(out_channels, -1).numpy()
    for g in range(groups):
        o, kk = slice(g * og, (g + 1) * og), slice(g * kg, (g + 1) * kg)
        suffix = f".g{g}" if g else ""
        options = dict(unit=unit, in_format=in_format, rounding=rounding)
        bias = np.broadcast_to(conv.bias.detach().numpy()[o, None], (og, n * positions))
        np.testing.assert_array_equal(y_cols[o], _matmul(w2[o], B[kk], bias,
                                                         seed=rt.layer_seed(5, "", "forward" + suffix, 0), **options))
        np.testing.assert_array_equal(conv.weight.grad.reshape(out_channels, -1).numpy()[o],
                                      _matmul(G[o], B[kk].T, seed=rt.layer_seed(5, "", "backward.weight" + suffix, 0),
                                              **_backward_options(options, grad_in_format, "A")))
        grad_cols = _matmul(w2[o].T, G[o], seed=rt.layer_seed(5, "", "backward.input" + suffix, 0),
                            **_backward_options(options, grad_in_format, "B"))
        if g == 0:
            all_cols = np.zeros((k, n * positions))
        all_cols[kk] = grad_cols
    folded = F.fold(torch.from_numpy(all_cols).reshape(k, n, positions).permute(1, 0, 2),
                    (x.shape[2] + pad[2] + pad[3], x.shape[3] + pad[0] + pad[1]), conv.kernel_size,
                    dilation=conv.dilation, stride=conv.stride)
    folded = folded[:, :, pad[2]:folded.shape[2] - pad[3], pad[0]:folded.shape[3] - pad[1]]
    np.testing.assert_array_equal(x.grad.numpy(), folded.float().numpy())


def _small_integers(*shape, generator):
    return torch.randint(-8, 9, shape, generator=generator).double() / 4


def test_exact_unit_gradients_equal_float64_autograd():
    # In and out fp64: each GEMM element is the exact sum rounded once into float64; with
    # inputs of a few bits every sum is exact, so torch's float64 gives the same bits.
    g = torch.Generator().manual_seed(3)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(3 * 4 * 4, 5)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(_small_integers(*p.shape, generator=g))
    reference = copy.deepcopy(model)
    x = _small_integers(4, 2, 8, 8, generator=g).requires_grad_()
    x_reference = x.detach().clone().requires_grad_()
    target = _small_integers(4, 5, generator=g)
    rt.emulate(model, unit="exact", in_format="fp64", out_format="fp64")
    ((model(x) - target) ** 2).sum().backward()
    ((reference(x_reference) - target) ** 2).sum().backward()
    assert torch.equal(x.grad, x_reference.grad)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad), name


def _train(unit, seed, steps=20, **options):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    rt.emulate(model, unit=unit, seed=seed, **options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, labels = torch.randn(8, 1, 6, 6, generator=data), torch.randint(0, 3, (8,), generator=data)
        optimizer.zero_grad()
        F.cross_entropy(model(x), labels).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


# Stochastic rounding in the unit (ipu-amp-half's fp16 partials under esr) and between
# layers (ipu-amp's fp32 partials round to nearest, as the hardware's do).
@pytest.mark.parametrize("unit,options", [("ipu-amp", dict(act_format="fp16", act_rounding="sr")),
                                          ("ipu-amp-half", dict(esr=True)),
                                          ("h100", dict(act_format="bf16", act_rounding="sr", grad_format="fp16",
                                                        grad_rounding="sr"))])
def test_same_seed_same_weights_after_20_steps(unit, options):
    first, second, other = _train(unit, 11, **options), _train(unit, 11, **options), _train(unit, 12, **options)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))  # the seed matters


# ---- exceptions ----------------------------------------------------------------------

class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(2, 2, bias=False), nn.Linear(2, 1, bias=False)

    def forward(self, x):
        return self.fc2(self.fc1(x))


def _overflowing_net():
    net = _Net()
    with torch.no_grad():
        net.fc1.weight.fill_(1.0)
        net.fc2.weight.fill_(300.0)  # 600 * 300 * 2 overflows fp16 partials
    return net


def test_counts_name_the_module_op_and_first_element():
    net = rt.emulate(_overflowing_net(), unit="ipu-amp-half", fp_exceptions="count")
    x = torch.full((3, 2), 300.0, requires_grad=True)
    net(x).sum().backward()
    table = rt.exception_table(net)
    forward = table[(table.scope == "fc2") & (table.op == "forward") & (table.flag == "OFLO")]
    assert len(forward) == 1 and forward.iloc[0]["count"] == 3 and forward.iloc[0]["element"] == (0, 0)
    assert set(table[table.op == "forward"].scope) == {"fc2"}  # fc1's results (600) are fine
    assert list(table.columns[:6]) == ["scope", "op", "unit_op", "flag", "count", "element"]
    net(x)  # counts add up over calls; the first element stays
    again = rt.exception_table(net)
    again = again[(again.scope == "fc2") & (again.op == "forward") & (again.flag == "OFLO")].iloc[0]
    assert again["count"] == 6 and again["element"] == (0, 0)


def test_act_and_grad_rounding_count_as_round():
    net = rt.emulate(_overflowing_net(), unit="h100", act_format="fp16", grad_format="fp16", fp_exceptions="count")
    net(torch.full((1, 2), 300.0)).sum().backward()
    table = rt.exception_table(net)
    assert table[["scope", "op", "flag"]].values.tolist() == [["fc2", "round", "OFLO"]]


def test_trap_raises_floating_point_trap_with_the_module():
    net = rt.emulate(_overflowing_net(), unit="ipu-amp-half", fp_exceptions="trap")
    with pytest.raises(roundoff.FloatingPointTrap) as trap:
        net(torch.full((3, 2), 300.0))
    assert (trap.value.flag, trap.value.scope, trap.value.op, trap.value.element) == ("OFLO", "fc2", "forward", 0)
    net = rt.emulate(_overflowing_net(), unit="ipu-amp-half", fp_exceptions="trap")
    with torch.no_grad():
        net.fc2.weight.fill_(1.0)
    y = net(torch.full((3, 2), 300.0, requires_grad=True))
    with pytest.raises(roundoff.FloatingPointTrap) as trap:
        y.backward(torch.full_like(y, 60000.0))
    assert (trap.value.scope, trap.value.op) == ("fc2", "backward.weight")


def test_round_output_rounds_any_module():
    net = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
    rt.emulate(net, unit="exact", act_format="fp8-e4m3", fp_exceptions="count")
    rt.round_output(net, nn.LayerNorm)
    y = net(torch.randn(5, 2))
    assert torch.equal(y, rt.round(y, "fp8-e4m3")[0])
    with pytest.raises(ValueError, match="not a module"):
        rt.round_output(net, "decoder")


# ---- bad input ------------------------------------------------------------------------

def test_an_unknown_unit_is_named_as_roundoff_matmul_names_it():
    with pytest.raises(ValueError) as ours:
        rt.emulate(nn.Linear(2, 2), unit="h1000")
    with pytest.raises(ValueError) as theirs:
        roundoff.matmul(np.ones((2, 2)), np.ones((2, 2)), unit="h1000")
    # The message of roundoff.matmul, with the keyword for the calculator's option.
    assert str(theirs.value).replace("--unit", "unit") in str(ours.value)
    assert "--unit" not in str(ours.value)


def test_bad_input_names_the_module_and_option():
    with pytest.raises(ValueError, match="unit='h1000'"):
        rt.emulate(nn.Linear(2, 2), unit="h1000")
    with pytest.raises(ValueError, match="act_format='fp7'"):
        rt.emulate(nn.Linear(2, 2), unit="h100", act_format="fp7")
    with pytest.raises(ValueError, match="fp_exceptions='loud'"):
        rt.emulate(nn.Linear(2, 2), unit="h100", fp_exceptions="loud")
    with pytest.raises(ValueError, match="in_format='mxint8'"):
        rt.emulate(nn.Linear(2, 2), unit="b200", in_format="mxint8")
    with pytest.raises(TypeError, match=r"1 \(Conv1d\).*keep_float32"):
        rt.emulate(nn.Sequential(nn.Linear(2, 2), nn.Conv1d(1, 1, 1)), unit="h100")
    rt.emulate(nn.Sequential(nn.Linear(2, 2), nn.Conv1d(1, 1, 1)), unit="h100", keep_float32=nn.Conv1d)
    with pytest.raises(TypeError, match=r"0 \(Linear\) has torch.float16"):
        rt.emulate(nn.Sequential(nn.Linear(2, 2).half()), unit="h100")
    with pytest.raises(ValueError, match="padding_mode='reflect'"):
        rt.emulate(nn.Conv2d(1, 1, 3, padding=1, padding_mode="reflect"), unit="h100")
    net = rt.emulate(nn.Sequential(nn.Linear(2, 2)), unit="h100")
    with pytest.raises(TypeError, match="0 .Linear. got a torch.float64 input"):
        net(torch.ones(1, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match="meta"):
        net(torch.ones(1, 2, device="meta"))


def test_transformer_layer_in_eval_mode_runs_its_linears_through_the_unit():
    # torch's fused encoder-layer kernel (eval mode, no autograd) would skip the Linears'
    # forward: emulate turns it off, so fp8 activations change the output there too.
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    reference = copy.deepcopy(layer).eval()
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    expected_model = nn.TransformerEncoder(reference, 2, enable_nested_tensor=False).eval()
    rt.emulate(model, unit="exact", act_format="fp8-e4m3", keep_float32=(nn.MultiheadAttention,)).eval()
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        got, expected = model(x), expected_model(x)
        h = model.layers[1].linear2(torch.ones(3, 5, 32))
    assert not torch.equal(got, expected)
    assert torch.equal(h, rt.round(h, "fp8-e4m3")[0])


def test_emulating_again_replaces_the_earlier_settings():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    plain = copy.deepcopy(net)
    x = torch.randn(3, 4)
    rt.emulate(net, unit="h100", act_format="fp8-e4m3")
    assert not torch.equal(net(x), plain(x))
    rt.emulate(net, unit="exact", keep_float32=(nn.Linear,))
    assert torch.equal(net(x), plain(x))
