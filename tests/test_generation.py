from utils import generation


def test_extract_answer_strict_then_flexible():
    assert generation.extract_answer("so 3*4 = <<3*4=12>>12.\n#### 12") == "12"
    assert generation.extract_answer("#### 1,234") == "1234"
    assert generation.extract_answer("She makes $18 every day.") == "18"
    assert generation.extract_answer("It is 70,000.") == "70000"
    assert generation.extract_answer("no digits here") is None


def test_cut_stops_at_the_next_problem():
    assert generation.cut(" Tom has 3.\n#### 3\n\nQuestion: more") == "Tom has 3.\n#### 3"
    assert generation.prompt("Q?") == "Question: Q?\nAnswer:"


def test_builtin_problems_carry_their_answers():
    got = [generation.extract_answer(p["answer"]) for p in generation.BUILTIN_PROBLEMS]
    assert got == ["18", "3", "70000"]


def test_greedy_answers_with_a_tiny_model():
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {c: i for i, c in enumerate(["<eos>"] + sorted(set("QuestionAnswer:?0123456789 \n")))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    t = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(vocab), hidden_size=16, intermediate_size=32,
                                     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)).eval()
    a = generation.greedy_answers(m, t, ["1?", "2?"], max_new_tokens=5)
    assert len(a) == 2 and all(isinstance(x, str) for x in a)
    assert a == generation.greedy_answers(m, t, ["1?", "2?"], max_new_tokens=5)   # greedy: deterministic
