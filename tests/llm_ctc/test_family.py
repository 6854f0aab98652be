"""llm_ctc.family and its optimizer: registration in asr.config, the LLM tokenizer as the
lexicon, output lengths, AdamW clipping (also under fp16 loss scaling) and the warm-up +
cosine schedule, each against its definition."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asr.config import load_run_config
from llm_ctc.optim import ClippedAdamW, WarmupCosine
from references.tiny_llm import QWEN3_HEAD_ROWS, QWEN3_TOKENIZER_SIZE, random_features

ROOT = Path(__file__).resolve().parents[2]


def test_mini_presets_read_as_the_llm_family_without_importing_torch() -> None:
    program = (
        "import sys; from asr.config import load_run_config\n"
        "ctc = load_run_config('egs/mini/conf/llm_ctc.yaml', ['optim.lr=2e-4', 'model.lora_targets=q_proj,v_proj'])\n"
        "ce = load_run_config('egs/mini/conf/llm_ce.yaml')\n"
        "print(type(ctc.model).__name__, type(ctc.optim).__name__, ctc.optim.lr, ctc.model.lora_targets,\n"
        "      ce.model.objective, ce.decode.methods, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", program], cwd=ROOT, check=True, capture_output=True, text=True)
    assert out.stdout.split() == ["LLMASRConfig", "AdamWOptions", "0.0002", "('q_proj',", "'v_proj')", "ce",
                                  "('llm-greedy-search',", "'llm-beam-search')", "False"]


def test_optim_defaults_are_the_papers_shared_llm_settings() -> None:
    """Paper App. D.2, Table 8: AdamW, peak 1e-4, decay 0.1, moments 0.9/0.95, eps 1e-6,
    200 linear warm-up updates, floor 5% of the peak, clip norm 5."""
    optim = load_run_config(None, ["family=llm_ctc"]).optim
    assert (optim.lr, optim.weight_decay, optim.beta1, optim.beta2, optim.eps) == (1e-4, 0.1, 0.9, 0.95, 1e-6)
    assert (optim.warmup_batches, optim.final_lr_fraction, optim.clip_norm) == (200, 0.05, 5.0)
    with pytest.raises(ValueError, match=r"optim.decay_batches \(100\) must exceed optim.warmup_batches \(200\)"):
        load_run_config(None, ["family=llm_ctc", "optim.decay_batches=100"])


def test_decode_methods_of_generation_are_known() -> None:
    config = load_run_config(None, ["family=llm_ctc", "decode.methods=llm-greedy-search,llm-beam-search"])
    assert config.decode.methods == ("llm-greedy-search", "llm-beam-search")
    with pytest.raises(ValueError, match="unknown method 'llm-sampling'"):
        load_run_config(None, ["decode.methods=llm-sampling"])


def test_lexicon_is_the_llm_tokenizer_with_the_first_unused_head_row_as_blank(ctc_config, qwen3_tokenizer) -> None:
    from llm_ctc.family import build_tokenizer

    tokenizer = build_tokenizer(ctc_config)
    assert (tokenizer.vocab_size, tokenizer.blank_id) == (QWEN3_HEAD_ROWS, QWEN3_TOKENIZER_SIZE)
    text = "Hello World, 你好"
    assert tokenizer.encode([text]) == [qwen3_tokenizer.encode(text.lower(), add_special_tokens=False)]
    assert tokenizer.decode(tokenizer.encode([text])[0] + [tokenizer.blank_id]) == text.lower()
    assert tokenizer.normalize_reference("HELLO World") == "hello world"


def test_transcripts_after_a_space_give_every_word_its_form_after_another_word(ctc_config, ctc_model,
                                                                              qwen3_tokenizer) -> None:
    """model.transcript_leading_space: a text's first word takes the token it has after
    another word (Qwen3's BPE has "why" and " why"), so a sentence's ids are its ids inside
    a longer text; decoding gives the text back without the space."""
    import dataclasses

    from llm_ctc.family import build_tokenizer
    from llm_ctc.tokenizer import LLMTokenizer

    plain, spaced = build_tokenizer(ctc_config), build_tokenizer(
        dataclasses.replace(ctc_config, transcript_leading_space=True))
    sentence = "Why did Ursula keep it"
    inside = qwen3_tokenizer.encode("so " + sentence.lower(), add_special_tokens=False)
    [ids] = spaced.encode([sentence])
    assert ids == inside[len(inside) - len(ids):] and inside[:len(inside) - len(ids)] == \
        qwen3_tokenizer.encode("so", add_special_tokens=False)
    [plain_ids] = plain.encode([sentence])
    assert plain_ids[0] != ids[0] and qwen3_tokenizer.decode(plain_ids[:1]) == "why"
    assert spaced.decode(ids + [spaced.blank_id]) == plain.decode(plain_ids) == sentence.lower()
    assert not LLMTokenizer.of_model(ctc_model).leading_space  # the model's own config decides
    ctc_model.config.transcript_leading_space = True
    try:
        assert LLMTokenizer.of_model(ctc_model).encode([sentence]) == [ids]
    finally:
        ctc_model.config.transcript_leading_space = False


def test_output_lengths_are_the_readout_lengths(ctc_model) -> None:
    adapter = ctc_model
    lengths = [9, 30, 61, 100, 131]
    features, feature_lens = random_features(lengths, seed=5)
    with torch.no_grad():
        _, readout_lens = ctc_model.ctc_states(features, feature_lens)
    assert adapter.output_lengths(feature_lens).tolist() == readout_lens.tolist()
    assert [adapter.output_lengths(n) for n in lengths] == readout_lens.tolist()


def reference_adamw_step(parameters, grads, clip_norm, **options):
    """torch's AdamW on copies, after scaling the gradients by min(1, c / ||g||) in float64."""
    copies = [p.detach().clone().requires_grad_(True) for p in parameters]
    norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    scale = min(1.0, clip_norm / (norm + 1e-6))
    for copy, grad in zip(copies, grads):
        copy.grad = (grad.double() * scale).float()
    torch.optim.AdamW(copies, **options).step()
    return copies, norm


@pytest.mark.parametrize("grad_scale", [None, 1024.0])
def test_clipping_happens_on_the_unscaled_gradients(grad_scale) -> None:
    torch.manual_seed(7)
    parameters = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]
    inputs = torch.randn(8, 3)
    options = dict(lr=0.1, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)

    def loss_of(params):
        return 30.0 * ((inputs @ params[0].t()).sum() * params[1][:4].sum()) ** 2 / 1e3

    loss = loss_of(parameters)
    grads = torch.autograd.grad(loss, parameters)
    expected, norm = reference_adamw_step(parameters, grads, clip_norm=5.0, **options)
    assert norm > 5.0  # the clipping acts
    optimizer = ClippedAdamW(parameters, clip_norm=5.0, **options)
    if grad_scale is None:
        loss_of(parameters).backward()
        optimizer.step()
    else:
        scaler = torch.amp.GradScaler("cpu", init_scale=grad_scale)
        scaler.scale(loss_of(parameters)).backward()
        scaler.step(optimizer)
    assert optimizer.last_grad_norm == pytest.approx(norm, rel=1e-5)
    for got, want in zip(parameters, expected):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-6)


def test_schedule_warms_up_linearly_then_follows_the_cosine_to_its_floor() -> None:
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([parameter], lr=2e-4)
    schedule = WarmupCosine(optimizer, warmup_batches=200, decay_batches=1200, final_fraction=0.05)
    observed = {}
    for batch in (1, 100, 200, 700, 1200, 5000):
        schedule.step_batch(batch)
        observed[batch] = schedule.get_last_lr()[0]
    assert observed[1] == pytest.approx(2e-4 / 200) and observed[100] == pytest.approx(1e-4)
    assert observed[200] == pytest.approx(2e-4)
    assert observed[700] == pytest.approx(2e-4 * (0.05 + 1.0) / 2)  # halfway: cos(pi / 2) = 0
    assert observed[1200] == pytest.approx(1e-5) and observed[5000] == pytest.approx(1e-5)
    restored = WarmupCosine(torch.optim.AdamW([parameter], lr=2e-4), 1, 2)
    restored.load_state_dict(schedule.state_dict())
    assert restored.get_last_lr() == schedule.get_last_lr() and restored.batch == 5000


def test_a_missing_llm_folder_is_one_line_and_leaves_nothing_behind(small_training_corpus, ctc_config, tmp_path):
    from asr.train import main as train
    from references.tiny_llm import tiny_llm_training_arguments

    exp_dir = tmp_path / "exp"
    missing = tmp_path / "no_such_llm"
    arguments = [argument for argument in tiny_llm_training_arguments(small_training_corpus, ctc_config, exp_dir)
                 if not argument.startswith(("model.llm=", "model.tokenizer="))]
    with pytest.raises(SystemExit, match=f"ERROR: model.(llm|tokenizer).*{missing}.*does not exist"):
        train([*arguments, f"model.llm={missing}"])
    assert not exp_dir.exists()


def test_a_missing_encoder_checkpoint_is_one_line_and_leaves_nothing_behind(small_training_corpus, ctc_config,
                                                                            tmp_path):
    from asr.train import main as train
    from references.tiny_llm import tiny_llm_training_arguments

    exp_dir = tmp_path / "exp"
    missing = tmp_path / "no_such_encoder.pt"
    arguments = tiny_llm_training_arguments(small_training_corpus, ctc_config, exp_dir)
    with pytest.raises(SystemExit, match=f"^ERROR: model.encoder_path: Zipformer checkpoint not found: {missing}$"):
        train([*arguments, f"model.encoder_path={missing}"])
    assert not exp_dir.exists()


@pytest.mark.parametrize("settings", [
    dict(objective="ctc", readout="query"),
    dict(objective="ctc", readout="speech"),
    dict(objective="ce"),
    dict(objective="ctc", readout="query", encoder_lr_scale=0.1, encoder_trained_blocks=2),
    dict(objective="ctc", readout="query", encoder_lr_scale=0.1, streaming=True),
])
def test_a_model_that_vouches_for_every_trained_weight_gives_each_a_gradient(settings, ctc_config,
                                                                               qwen3_tokenizer) -> None:
    """asr.trainee turns DDP's search for unused weights off on the model's word: one
    backward pass must reach every weight that trains (an unused one has no gradient)."""
    import dataclasses

    from llm_ctc import build_model

    torch.manual_seed(4)
    model = build_model(dataclasses.replace(ctc_config, **settings), tokenizer=qwen3_tokenizer).train()
    assert model.uses_every_trained_weight()
    features, lengths = random_features([230, 150], seed=5)
    loss, _ = model.loss(features, lengths, model.encode_texts(["hello world", "good morning"]))
    loss.backward()
    trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert [name for name, p in trained.items() if p.grad is None] == []
    assert any(name.startswith("encoder.") for name in trained) == ("encoder_lr_scale" in settings)


def test_the_zipformer_skips_layers_so_it_does_not_vouch_for_its_weights() -> None:
    """The default (DDP searches for unused weights) is what the Zipformer needs: early in
    training its stochastic schedules skip whole layers, whose weights then get no gradient."""
    from zipformer.model import CTCModel
    from zipformer.presets import get_preset
    from zipformer.scaling import set_batch_count

    torch.manual_seed(6)
    model = CTCModel(get_preset("tiny", vocab_size=30)).train()
    set_batch_count(model, 0.0)
    assert not model.uses_every_trained_weight()
    unused_in_some_step = set()
    features, lengths = random_features([300, 250], seed=7)
    for _ in range(6):
        model.zero_grad(set_to_none=True)
        loss, _ = model(features, lengths, [[1, 2, 3], [4, 5]], return_stats=True)
        loss.backward()
        unused_in_some_step |= {name for name, p in model.named_parameters() if p.grad is None}
    assert unused_in_some_step
