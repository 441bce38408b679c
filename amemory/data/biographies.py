"""Heavy-tailed knowledge QA from synthetic biographies (paper A, section A.3).

Source: Wang et al. 2025, "Muon Outperforms Adam in Tail-End Associative Memory
Learning" (arXiv 2509.26030), heavy-tailed knowledge QA; the biography/QA format
follows Allen-Zhu & Li, "Physics of Language Models 3.1" (arXiv 2309.14316).
Everything is generated locally and deterministically from ``cfg.seed``.

* **Vocabularies**: distinct pronounceable pseudo-words give the first names, surnames,
  cities, and the stems of universities ("Velmora University"), majors ("Tharistics")
  and employers ("Drovin Labs"); pool sizes in :class:`BiographyConfig`.
* **Individuals**: 2^m, each with a unique (first name, surname) pair and 7 attributes
  (:data:`ATTRIBUTES`; birth dates are valid calendar dates in 1950-2005), drawn
  uniformly and independently.
* **Groups** (heavy tail): group g = 0..m holds N_0 = 1, N_g = 2^(g-1) individuals (ids
  ordered by group), each appearing in S_g = 2^(m-g) *selections*; ``zipf`` = s gives
  S_g = round(2^(s (m-g))), frequency ∝ rank^-s (s = 1 the paper's law, 0 uniform).
* **Training rows**, per selection: one biography row (if ``cfg.biographies``):
  ``<bos>``, six sentences naming the person (template per attribute and sentence order
  drawn per paraphrase; selection s uses paraphrase s mod ``n_paraphrases``), ``<eos>``,
  loss on every token after ``<bos>``; and one QA row (if ``cfg.qa``): ``<bos>`` then the
  6 pairs ``question-words ? Answer: value-tokens <eos>`` in an order drawn per selection,
  loss on the answers and their ``<eos>`` only. Rows are right-padded with ``<pad>``.
* **Evaluation**: every individual x every template, prompt ``<bos> question-words ?
  Answer:``; first-token accuracy (FTA) per group: the argmax at the last prompt position
  must be the first answer token (for birth dates: the month).
* **Tokenizer**: exact, one token per template word, month, day, year and attribute value;
  keys are typed (``"first:Kalo"``, ``"w:born"``); ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2.

Training convention (as :mod:`amemory.data.batching`): inputs = tokens[:, :-1], targets =
tokens[:, 1:], per-target weights = loss_mask[:, 1:].
"""

from __future__ import annotations

import calendar
import dataclasses
import numbers

import numpy as np

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"

#: The 7 attributes of an individual (the name identifies; the other 6 are asked about).
ATTRIBUTES = ("name", "birth_date", "birth_city", "university", "major", "employer", "work_city")
_ASKED = ATTRIBUTES[1:]

#: One question template per asked attribute ("{name}" = first and last name tokens).
QUESTION_TEMPLATES = (
    "What is the birth date of {name} ?",
    "Which city was {name} born in ?",
    "Which university did {name} attend ?",
    "What did {name} study ?",
    "Which company does {name} work for ?",
    "In which city does {name} work ?",
)

# Biography sentence variants per asked attribute ({name} then the value follows).
# fmt: off
_SENTENCES = {
    "birth_date": ("{name} was born on {v} .", "{name} came into this world on {v} .",
                   "{name} celebrates a birthday on {v} .", "The birth date of {name} is {v} ."),
    "birth_city": ("{name} was born in {v} .", "{name} spent early years in {v} .",
                   "{name} hails from {v} .", "The birthplace of {name} is {v} ."),
    "university": ("{name} studied at {v} .", "{name} graduated from {v} .",
                   "{name} received an education at {v} .", "{name} attended {v} ."),
    "major": ("{name} majored in {v} .", "{name} focused on {v} .",
              "{name} completed a degree in {v} .", "The field of study of {name} was {v} ."),
    "employer": ("{name} works for {v} .", "{name} is employed by {v} .",
                 "{name} has a job at {v} .", "The employer of {name} is {v} ."),
    "work_city": ("{name} works in {v} .", "{name} commutes to an office in {v} .",
                  "{name} is based in {v} .", "The workplace of {name} is in {v} ."),
}
# fmt: on

_MONTHS = tuple(calendar.month_name[1:])
_YEARS = tuple(range(1950, 2006))

_ONSETS = ("b c d f g h j k l m n p r s t v w z br ch cl dr fl gr kr pl pr sh st th tr vr").split()
_VOWELS = "a e i o u a e i o ai ea io ou ia".split()
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "th", "nd", "rt")
_UNI_SUFFIX = ("University", "College", "Institute", "Academy")
_MAJOR_SUFFIX = ("ology", "istics", "onomy", "ography", "ics", "ism")
_EMPLOYER_SUFFIX = ("Labs", "Systems", "Group", "Industries", "Works", "Holdings")


@dataclasses.dataclass(frozen=True)
class BiographyConfig:
    """Size and seed of the synthetic biography QA (paper A, A.3).

    Attributes:
      m: groups g = 0..m, 2^m individuals (paper: 15; default 8 for CPU).
      seed: seed of everything (vocabularies, attributes, paraphrases, row order).
      n_first_names, n_surnames, n_universities, n_majors, n_employers, n_cities:
        pool sizes of the synthesised vocabularies (paper: 400, 1000, 300, 100, 300).
      n_paraphrases: biographies per individual (>= 1).
      biographies, qa: include biography / QA rows in training (at least one).
      zipf: exponent s of the selection law S_g = round(2^(s (m-g))), in [0, 3].
    """

    m: int = 8
    seed: int = 0
    n_first_names: int = 400
    n_surnames: int = 1000
    n_universities: int = 300
    n_majors: int = 100
    n_employers: int = 300
    n_cities: int = 200
    n_paraphrases: int = 5
    biographies: bool = True
    qa: bool = True
    zipf: float = 1.0

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field."""
        sizes = [f.name for f in dataclasses.fields(self) if f.name.startswith("n_")]
        limits = {"m": (0, 20), "seed": (0, None), **dict.fromkeys(sizes, (1, 100_000))}
        for f, (lo, hi) in limits.items():
            v = getattr(self, f)
            integer = isinstance(v, numbers.Integral) and not isinstance(v, bool)
            if not (integer and lo <= v <= (v if hi is None else hi)):
                allowed = "a non-negative integer" if hi is None else f"an integer in [{lo}, {hi}]"
                raise ValueError(f"{f} must be {allowed}, got {v!r}")
        if self.n_first_names * self.n_surnames < 2**self.m:
            raise ValueError(
                f"n_first_names * n_surnames = {self.n_first_names * self.n_surnames} must be "
                f">= 2^m = {2**self.m} so that every individual has a unique name"
            )
        if not (isinstance(self.zipf, numbers.Real) and 0.0 <= self.zipf <= 3.0):
            raise ValueError(f"zipf must be a number in [0, 3], got {self.zipf!r}")
        if not (self.biographies or self.qa):
            raise ValueError("biographies and qa are both False; enable at least one")


def group_sizes(m: int) -> np.ndarray:
    """N_g for g = 0..m: N_0 = 1, N_g = 2^(g-1). int64 [m + 1], summing to 2^m."""
    return np.array([1] + [2 ** (g - 1) for g in range(1, m + 1)], dtype=np.int64)


def group_repetitions(m: int, zipf: float = 1.0) -> np.ndarray:
    """S_g = round(2^(zipf (m-g))) for g = 0..m (2^(m-g) at zipf = 1): selections per
    individual of group g. int64 [m + 1]; frequency ∝ rank^-zipf, rank ≈ 2^g."""
    return np.array([round(2 ** (zipf * (m - g))) for g in range(m + 1)], dtype=np.int64)


class BiographyTokenizer:
    """Exact word/field-level tokenizer: one id per typed key (``"w:born"``, ``"uni:..."``).

    Attributes:
      keys: list of keys, index = token id; 0 ``<pad>``, 1 ``<bos>``, 2 ``<eos>``.
    """

    def __init__(self, keys: list[str]):
        if len(set(keys)) != len(keys):
            raise ValueError("tokenizer keys must be unique")
        self.keys = list(keys)
        self.index = {k: i for i, k in enumerate(self.keys)}
        self.pad_id, self.bos_id, self.eos_id = (self.index[k] for k in (PAD, BOS, EOS))

    @property
    def vocab_size(self) -> int:
        return len(self.keys)


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """QA evaluation items: every individual x every question template.

    Attributes (Q = 6 * 2^m items, P = longest prompt, all int32):
      prompts: [Q, P] ``<bos> question ? Answer:``, right-padded with ``<pad>``.
      prompt_len: [Q] real prompt tokens; predict at index prompt_len - 1.
      answer_first: [Q] first answer token (the FTA target).
      answers: [Q, A] answer tokens then ``<eos>``, right-padded.
      group, template, person: [Q] the individual's group, the question template
        (index into :data:`QUESTION_TEMPLATES`) and the individual's id.
    """

    prompts: np.ndarray
    prompt_len: np.ndarray
    answer_first: np.ndarray
    answers: np.ndarray
    group: np.ndarray
    template: np.ndarray
    person: np.ndarray

    def subset(self, index) -> EvalSet:
        """The items at ``index`` (int array or boolean mask)."""
        return EvalSet(*(getattr(self, f.name)[index] for f in dataclasses.fields(self)))

    def per_group(self, max_per_group: int, seed: int = 0) -> EvalSet:
        """A deterministic subset with at most ``max_per_group`` items per group."""
        rng = np.random.default_rng(seed)
        keep = []
        for g in np.unique(self.group):
            idx = np.flatnonzero(self.group == g)
            if idx.size > max_per_group:
                idx = np.sort(rng.choice(idx, max_per_group, replace=False))
            keep.append(idx)
        return self.subset(np.concatenate(keep))


@dataclasses.dataclass
class BiographyData:
    """Output of :func:`make_biographies`.

    Attributes:
      config: the :class:`BiographyConfig`; tokenizer: the :class:`BiographyTokenizer`.
      train_tokens: int32 [N, T] biography and QA rows, shuffled with the seed, padded.
      train_mask: float32 [N, T]; 1 where the token is a training target.
      train_kind: int8 [N]; 0 = biography row, 1 = QA row.
      train_person: int32 [N]; the individual of each row.
      eval: the :class:`EvalSet` (QA of all individuals).
      group: int32 [2^m], group of each individual (its S_g: :func:`group_repetitions`).
      attributes: dict attribute -> [2^m] token ids (``name``: [2^m, 2] first/last,
        ``birth_date``: [2^m, 3] month/day/year).
    """

    config: BiographyConfig
    tokenizer: BiographyTokenizer
    train_tokens: np.ndarray
    train_mask: np.ndarray
    train_kind: np.ndarray
    train_person: np.ndarray
    eval: EvalSet
    group: np.ndarray
    attributes: dict

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def seq_len(self) -> int:
        """Row length T (model context must be >= T - 1)."""
        return int(self.train_tokens.shape[1])

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_id

    def loader(self, batch_size: int, seed: int = 0, *, shard_options=None):
        """Grain loader of shuffled training rows (:func:`amemory.data.batching.row_loader`):
        ``{"tokens": int32 [B / P, T], "mask": float32 [B / P, T]}`` per process, forever."""
        from amemory.data.batching import row_loader  # lazy: Grain imports jax

        return row_loader(
            self.train_tokens, self.train_mask, batch_size, seed, shard_options=shard_options
        )


def _pseudo_words(rng: np.random.Generator, n: int, taken: set[str], syllables=(2, 3)) -> list[str]:
    out: list[str] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 200 * n + 10_000:
            raise ValueError(f"cannot synthesise {n} distinct names; lower the pool sizes")
        k = int(rng.integers(syllables[0], syllables[1] + 1))
        w = "".join(
            _ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))]
            for _ in range(k)
        )
        w = (w + _CODAS[rng.integers(len(_CODAS))]).capitalize()
        if w not in taken:
            taken.add(w)
            out.append(w)
    return out


def _words(template: str) -> list[str]:
    return [w for w in template.split() if w not in ("{name}", "{v}")]


def _vocabulary(rng: np.random.Generator, cfg: BiographyConfig):
    """The synthesised value pools (prefix -> distinct strings) and the tokenizer over them."""
    taken: set[str] = set(_MONTHS)
    pools = {
        "first": _pseudo_words(rng, cfg.n_first_names, taken, (1, 2)),
        "last": _pseudo_words(rng, cfg.n_surnames, taken, (2, 3)),
        "city": _pseudo_words(rng, cfg.n_cities, taken, (2, 3)),
    }

    def suffixed(n: int, suffixes: tuple[str, ...], sep: str, syllables=(2, 3)) -> list[str]:
        words = _pseudo_words(rng, n, taken, syllables)
        return [w + sep + suffixes[rng.integers(len(suffixes))] for w in words]

    pools["uni"] = suffixed(cfg.n_universities, _UNI_SUFFIX, " ")  # "Velmora University"
    pools["major"] = suffixed(cfg.n_majors, _MAJOR_SUFFIX, "", (1, 2))  # "Tharistics"
    pools["employer"] = suffixed(cfg.n_employers, _EMPLOYER_SUFFIX, " ")  # "Drovin Labs"
    template_words = sorted(
        {w for t in QUESTION_TEMPLATES for w in _words(t)}
        | {w for v in _SENTENCES.values() for t in v for w in _words(t)}
        | {"Answer:"}
    )
    keys = [PAD, BOS, EOS, *(f"w:{w}" for w in template_words)]
    keys += [f"month:{x}" for x in _MONTHS] + [f"day:{d}" for d in range(1, 32)]
    keys += [f"year:{y}" for y in _YEARS]
    keys += [f"{prefix}:{x}" for prefix, pool in pools.items() for x in pool]
    return pools, BiographyTokenizer(keys)


def _individuals(rng: np.random.Generator, cfg: BiographyConfig, pools, ix) -> dict:
    """Attribute token ids of the 2^m individuals (see :class:`BiographyData`)."""
    n = 2**cfg.m
    pair = rng.choice(cfg.n_first_names * cfg.n_surnames, size=n, replace=False)
    name = [
        [ix[f"first:{pools['first'][f]}"], ix[f"last:{pools['last'][s]}"]]
        for f, s in zip(*np.divmod(pair, cfg.n_surnames), strict=True)
    ]
    year = rng.integers(0, len(_YEARS), n)
    month = rng.integers(1, 13, n)
    day = [
        1 + rng.integers(calendar.monthrange(_YEARS[y], mo)[1])
        for y, mo in zip(year, month, strict=True)
    ]
    birth_date = [
        [ix[f"month:{_MONTHS[mo - 1]}"], ix[f"day:{d}"], ix[f"year:{_YEARS[y]}"]]
        for mo, d, y in zip(month, day, year, strict=True)
    ]

    def pick(prefix):
        pool = pools[prefix]
        return [ix[f"{prefix}:{pool[i]}"] for i in rng.integers(0, len(pool), n)]

    attrs = {"name": name, "birth_date": birth_date, "birth_city": pick("city")}
    attrs |= {"university": pick("uni"), "major": pick("major"), "employer": pick("employer")}
    attrs["work_city"] = pick("city")
    return {a: np.asarray(v, dtype=np.int32) for a, v in attrs.items()}


class _Writer:
    """Token ids of the sentences and QA pairs about one individual."""

    def __init__(self, tok: BiographyTokenizer, attrs: dict):
        self.tok, self.attrs = tok, attrs

    def value(self, attribute: str, p: int) -> list[int]:
        return [int(x) for x in np.atleast_1d(self.attrs[attribute][p])]

    def fill(self, template: str, p: int, value: list[int]) -> list[int]:
        slots = {"{name}": self.value("name", p), "{v}": value}
        words = template.split()
        return [i for w in words for i in (slots[w] if w in slots else [self.tok.index[f"w:{w}"]])]

    def biography(self, rng: np.random.Generator, p: int) -> list[int]:
        """One paraphrase: the six attribute sentences, order and variants drawn from rng."""
        out: list[int] = []
        for a in [_ASKED[i] for i in rng.permutation(len(_ASKED))]:
            variants = _SENTENCES[a]
            out += self.fill(variants[rng.integers(len(variants))], p, self.value(a, p))
        return out

    def qa_pair(self, p: int, t: int) -> tuple[list[int], list[int]]:
        """(question tokens ending in 'Answer:', answer tokens ending in <eos>)."""
        q = self.fill(QUESTION_TEMPLATES[t], p, []) + [self.tok.index["w:Answer:"]]
        return q, self.value(_ASKED[t], p) + [self.tok.eos_id]


def _pad(rows: list[list[int]], value: int, dtype) -> np.ndarray:
    """Ragged rows right-padded with ``value`` to one ``[len(rows), longest]`` array."""
    out = np.full((len(rows), max(map(len, rows))), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def make_biographies(cfg: BiographyConfig | None = None) -> BiographyData:
    """Generate the heavy-tailed biography QA dataset (see the module docstring).

    Args:
      cfg: a :class:`BiographyConfig` (default ``BiographyConfig()``).

    Returns:
      A :class:`BiographyData`, identical for identical configs.

    Raises:
      ValueError: naming the invalid config field.
    """
    cfg = BiographyConfig() if cfg is None else cfg
    if not isinstance(cfg, BiographyConfig):
        raise ValueError(f"cfg must be a BiographyConfig, got {type(cfg).__name__}")
    cfg.validate()
    rng = np.random.default_rng([cfg.seed, 0xB10])
    pools, tok = _vocabulary(rng, cfg)
    attrs = _individuals(rng, cfg, pools, tok.index)
    group = np.repeat(np.arange(cfg.m + 1), group_sizes(cfg.m)).astype(np.int32)
    reps = group_repetitions(cfg.m, cfg.zipf)[group]
    write = _Writer(tok, attrs)
    people = range(2**cfg.m)
    bios = [[write.biography(rng, p) for _ in range(cfg.n_paraphrases)] for p in people]

    # training rows, one bio row and one QA row per selection: (tokens, mask, kind, person)
    rows: list[tuple[list[int], list[int], int, int]] = []
    for p in people:
        for s in range(int(reps[p])):
            if cfg.biographies:
                body = bios[p][s % cfg.n_paraphrases] + [tok.eos_id]
                rows.append(([tok.bos_id] + body, [0] + [1] * len(body), 0, p))
            if cfg.qa:
                row, mask = [tok.bos_id], [0]
                for t in rng.permutation(len(QUESTION_TEMPLATES)):
                    q, a = write.qa_pair(p, int(t))
                    row += q + a
                    mask += [0] * len(q) + [1] * len(a)
                rows.append((row, mask, 1, p))
    tokens, masks, kinds, persons = zip(*rows, strict=True)
    perm = rng.permutation(len(rows))

    # evaluation: all individuals x all templates
    items = np.array([(p, t) for p in people for t in range(len(QUESTION_TEMPLATES))], np.int32)
    pairs = [write.qa_pair(int(p), int(t)) for p, t in items]
    prompts = [[tok.bos_id] + q for q, _ in pairs]
    answers = _pad([a for _, a in pairs], tok.pad_id, np.int32)
    return BiographyData(
        config=cfg,
        tokenizer=tok,
        train_tokens=_pad(tokens, tok.pad_id, np.int32)[perm],
        train_mask=_pad(masks, 0, np.float32)[perm],
        train_kind=np.asarray(kinds, dtype=np.int8)[perm],
        train_person=np.asarray(persons, dtype=np.int32)[perm],
        eval=EvalSet(
            prompts=_pad(prompts, tok.pad_id, np.int32),
            prompt_len=np.array([len(q) for q in prompts], dtype=np.int32),
            answer_first=answers[:, 0].copy(),
            answers=answers,
            group=group[items[:, 0]],
            template=items[:, 1].copy(),
            person=items[:, 0].copy(),
        ),
        group=group,
        attributes=attrs,
    )
