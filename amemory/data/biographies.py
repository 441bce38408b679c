"""Heavy-tailed knowledge QA from synthetic biographies (paper A, section A.3).

Source: Wang et al. 2025, "Muon Outperforms Adam in Tail-End Associative Memory
Learning" (arXiv 2509.26030), heavy-tailed knowledge QA; the biography/QA format
follows Allen-Zhu & Li, "Physics of Language Models 3.1" (arXiv 2309.14316).
Everything is generated locally and deterministically from ``cfg.seed``.

Exact data design
-----------------
* **Vocabularies** are synthesised by the generator (no external lists):
  pronounceable pseudo-words built from syllables give ``n_first_names`` first
  names, ``n_surnames`` surnames, ``n_cities`` cities, and the stems of
  ``n_universities`` universities ("Velmora University"), ``n_majors`` majors
  ("Tharistics") and ``n_employers`` employers ("Drovin Labs"). All strings are
  distinct. Defaults follow the paper: 400 / 1000 / 300 / 100 / 300 (+ 200 cities).
* **Individuals**: 2^m of them, each with a unique (first name, surname) pair and
  7 attributes: full name, birth date (month day year, valid calendar dates in
  1950-2005), birth city, university, major, employer, work city; values are drawn
  uniformly and independently.
* **Groups** (heavy tail): group g = 0..m holds N_0 = 1, N_g = 2^(g-1) individuals
  (individual ids are ordered by group); every individual of group g appears in
  S_g = 2^(m-g) *selections*. Group 0 is the head (seen 2^m times), group m the
  tail (2^(m-1) individuals seen once). ``zipf`` = s generalises this to
  S_g = round(2^(s (m-g))): frequency ∝ rank^-s over the same individuals (s = 1 the
  paper's law, s = 0 uniform).
* **Training rows**: each selection of an individual contributes
    - one biography row (if ``cfg.biographies``): ``<bos>`` + six sentences, one
      per attribute, each naming the person (paraphrase: a sentence template drawn
      per attribute and a sentence order drawn per paraphrase) + ``<eos>``. Each
      individual has ``n_paraphrases`` fixed biographies; its s-th selection uses
      paraphrase s mod n_paraphrases. Loss on every token after ``<bos>``.
    - one QA row (if ``cfg.qa``): the 6 QA pairs of the individual (one per
      question template), in an order drawn per selection, each pair written
      ``question-words ? Answer: value-tokens <eos>`` after a leading ``<bos>``.
      Loss only on the answer tokens and their ``<eos>``.
  Rows are right-padded with ``<pad>`` to one length T. So with both switches on
  the training set has 2 (2^m + m 2^(m-1)) rows, half biographies, half QA.
* **Evaluation**: QA of *all* individuals, all 6 templates: the prompt is
  ``<bos> question-words ? Answer:`` and the metric is first-token accuracy (FTA):
  the model's argmax at the last prompt position must equal the first answer
  token (for birth dates: the month). FTA is reported per group g.
* **Tokenizer**: word/field level and exact. Every template word, month, day,
  year and attribute value is one token; keys are typed (``"first:Kalo"``,
  ``"city:Brenmouth"``, ``"w:born"``), so decoding is unambiguous. Special
  tokens: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2.

Training convention (same as the token windows of :mod:`amemory.data.batching`):
inputs = tokens[:, :-1], targets = tokens[:, 1:], per-target weights =
loss_mask[:, 1:]; ``loss_mask[n, t] = 1`` iff token t is a training target.

Layout: this module generates the data. Batches of its rows come from a Grain
loader (:meth:`BiographyData.loader`, :func:`amemory.data.batching.row_loader`) and the
FTA metric from :mod:`amemory.data.biography_eval` (re-exported here).
"""

from __future__ import annotations

import calendar
import dataclasses
import numbers

import numpy as np

from amemory.data.biography_eval import first_token_accuracy, first_token_predictions

__all__ = [
    "BiographyConfig",
    "BiographyTokenizer",
    "EvalSet",
    "BiographyData",
    "ATTRIBUTES",
    "QUESTION_TEMPLATES",
    "make_biographies",
    "group_sizes",
    "group_repetitions",
    "first_token_predictions",
    "first_token_accuracy",
]

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
_SENTENCES = {
    "birth_date": (
        "{name} was born on {v} .",
        "{name} came into this world on {v} .",
        "{name} celebrates a birthday on {v} .",
        "The birth date of {name} is {v} .",
    ),
    "birth_city": (
        "{name} was born in {v} .",
        "{name} spent early years in {v} .",
        "{name} hails from {v} .",
        "The birthplace of {name} is {v} .",
    ),
    "university": (
        "{name} studied at {v} .",
        "{name} graduated from {v} .",
        "{name} received an education at {v} .",
        "{name} attended {v} .",
    ),
    "major": (
        "{name} majored in {v} .",
        "{name} focused on {v} .",
        "{name} completed a degree in {v} .",
        "The field of study of {name} was {v} .",
    ),
    "employer": (
        "{name} works for {v} .",
        "{name} is employed by {v} .",
        "{name} has a job at {v} .",
        "The employer of {name} is {v} .",
    ),
    "work_city": (
        "{name} works in {v} .",
        "{name} commutes to an office in {v} .",
        "{name} is based in {v} .",
        "The workplace of {name} is in {v} .",
    ),
}

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
      m: number of tail groups; groups g = 0..m, 2^m individuals (paper: 15;
        default 8 for CPU: 256 individuals, 1280 selections).
      seed: seed of everything (vocabularies, attributes, paraphrases, row order).
      n_first_names, n_surnames, n_universities, n_majors, n_employers, n_cities:
        pool sizes of the synthesised vocabularies (paper: 400, 1000, 300, 100, 300).
      n_paraphrases: biographies per individual (>= 1).
      biographies: include biography rows in training.
      qa: include QA rows in training (at least one of the two must be on).
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
        if isinstance(self.m, bool) or not isinstance(self.m, numbers.Integral):
            raise ValueError(f"m must be an integer in [0, 20], got {self.m!r}")
        if not 0 <= self.m <= 20:
            raise ValueError(f"m must be an integer in [0, 20], got {self.m!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        for f in (
            "n_first_names",
            "n_surnames",
            "n_universities",
            "n_majors",
            "n_employers",
            "n_cities",
            "n_paraphrases",
        ):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 1 <= v <= 100_000:
                raise ValueError(f"{f} must be an integer in [1, 100000], got {v!r}")
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

    def encode(self, keys: list[str]) -> list[int]:
        """Typed keys -> ids. Raises ValueError naming an unknown key."""
        try:
            return [self.index[k] for k in keys]
        except KeyError as e:
            raise ValueError(f"unknown token key {e.args[0]!r}") from None

    def decode(self, ids, skip_special: bool = True) -> str:
        """ids -> readable text (keys without their type prefix, joined by spaces)."""
        out = []
        for i in np.asarray(ids).ravel().tolist():
            k = self.keys[int(i)]
            if k in (PAD, BOS, EOS):
                if skip_special:
                    continue
                out.append(k)
            else:
                out.append(k.split(":", 1)[1])
        return " ".join(out)


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """QA evaluation items: every individual x every question template.

    Attributes (Q = 6 * 2^m items, P = longest prompt):
      prompts: int32 [Q, P], ``<bos> question ? Answer:`` right-padded with ``<pad>``.
      prompt_len: int32 [Q], number of real prompt tokens; predict at index prompt_len - 1.
      answer_first: int32 [Q], first answer token (the FTA target).
      answers: int32 [Q, A], full answer tokens then ``<eos>``, right-padded.
      group: int32 [Q], group g of the individual.
      template: int32 [Q], question template 0..5 (order of :data:`QUESTION_TEMPLATES`).
      person: int32 [Q], individual id.
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
      config: the :class:`BiographyConfig`.
      tokenizer: the :class:`BiographyTokenizer`; ``vocab_size`` = its size.
      train_tokens: int32 [N, T] training rows (biography and QA rows, shuffled once
        with the seed), right-padded with ``pad_id``.
      train_mask: float32 [N, T]; 1 where the token is a training target.
      train_kind: int8 [N]; 0 = biography row, 1 = QA row.
      train_person: int32 [N]; the individual of each row.
      eval: the :class:`EvalSet` (QA of all individuals).
      group: int32 [2^m], group of each individual; ``repetitions``: int64 [2^m], S_g.
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
    repetitions: np.ndarray
    attributes: dict

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def train_sequences(self) -> tuple[np.ndarray, np.ndarray]:
        """(train_tokens int32 [N, T], train_mask float32 [N, T])."""
        return self.train_tokens, self.train_mask

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
        parts = []
        for j in range(k):
            parts.append(_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))])
            if j == k - 1:
                parts.append(_CODAS[rng.integers(len(_CODAS))])
        w = "".join(parts).capitalize()
        if w not in taken:
            taken.add(w)
            out.append(w)
    return out


def _words(template: str) -> list[str]:
    return [w for w in template.split() if w not in ("{name}", "{v}")]


def make_biographies(cfg: BiographyConfig | None = None) -> BiographyData:
    """Generate the heavy-tailed biography QA dataset (see the module docstring).

    Args:
      cfg: a :class:`BiographyConfig` (default: ``BiographyConfig()``, m = 8).

    Returns:
      A :class:`BiographyData`; identical arrays for identical configs.

    Raises:
      ValueError: naming the invalid config field.
    """
    cfg = BiographyConfig() if cfg is None else cfg
    if not isinstance(cfg, BiographyConfig):
        raise ValueError(f"cfg must be a BiographyConfig, got {type(cfg).__name__}")
    cfg.validate()
    rng = np.random.default_rng([cfg.seed, 0xB10])
    m = cfg.m
    n_people = 2**m

    # --- vocabularies (all strings distinct)
    taken: set[str] = set(_MONTHS)
    first = _pseudo_words(rng, cfg.n_first_names, taken, (1, 2))
    last = _pseudo_words(rng, cfg.n_surnames, taken, (2, 3))
    cities = _pseudo_words(rng, cfg.n_cities, taken, (2, 3))
    unis = [
        f"{w} {_UNI_SUFFIX[rng.integers(len(_UNI_SUFFIX))]}"
        for w in _pseudo_words(rng, cfg.n_universities, taken)
    ]
    majors = [
        w + _MAJOR_SUFFIX[rng.integers(len(_MAJOR_SUFFIX))].lower()
        for w in _pseudo_words(rng, cfg.n_majors, taken, (1, 2))
    ]
    employers = [
        f"{w} {_EMPLOYER_SUFFIX[rng.integers(len(_EMPLOYER_SUFFIX))]}"
        for w in _pseudo_words(rng, cfg.n_employers, taken)
    ]
    template_words = sorted(
        {w for t in QUESTION_TEMPLATES for w in _words(t)}
        | {w for v in _SENTENCES.values() for t in v for w in _words(t)}
        | {"Answer:"}
    )
    keys = [PAD, BOS, EOS]
    keys += [f"w:{w}" for w in template_words]
    keys += [f"month:{x}" for x in _MONTHS]
    keys += [f"day:{d}" for d in range(1, 32)]
    keys += [f"year:{y}" for y in _YEARS]
    keys += [f"first:{x}" for x in first] + [f"last:{x}" for x in last]
    keys += [f"city:{x}" for x in cities] + [f"uni:{x}" for x in unis]
    keys += [f"major:{x}" for x in majors] + [f"employer:{x}" for x in employers]
    tok = BiographyTokenizer(keys)
    ix = tok.index

    # --- individuals, ordered by group
    group = np.repeat(np.arange(m + 1), group_sizes(m)).astype(np.int32)
    reps = group_repetitions(m, cfg.zipf)[group]
    pair = rng.choice(cfg.n_first_names * cfg.n_surnames, size=n_people, replace=False)
    name = np.stack(
        [
            np.array([ix[f"first:{first[p // cfg.n_surnames]}"] for p in pair]),
            np.array([ix[f"last:{last[p % cfg.n_surnames]}"] for p in pair]),
        ],
        axis=1,
    ).astype(np.int32)
    year = rng.integers(0, len(_YEARS), n_people)
    month = rng.integers(1, 13, n_people)
    day = np.array(
        [
            1 + rng.integers(calendar.monthrange(_YEARS[y], mo)[1])
            for y, mo in zip(year, month, strict=True)
        ]
    )
    birth_date = np.stack(
        [
            np.array([ix[f"month:{_MONTHS[mo - 1]}"] for mo in month]),
            np.array([ix[f"day:{d}"] for d in day]),
            np.array([ix[f"year:{_YEARS[y]}"] for y in year]),
        ],
        axis=1,
    ).astype(np.int32)

    def pick(pool, prefix):
        return np.array([ix[f"{prefix}:{pool[i]}"] for i in rng.integers(0, len(pool), n_people)])

    attrs = {
        "name": name,
        "birth_date": birth_date,
        "birth_city": pick(cities, "city").astype(np.int32),
        "university": pick(unis, "uni").astype(np.int32),
        "major": pick(majors, "major").astype(np.int32),
        "employer": pick(employers, "employer").astype(np.int32),
        "work_city": pick(cities, "city").astype(np.int32),
    }

    def value_ids(a: str, p: int) -> list[int]:
        v = attrs[a][p]
        return [int(x) for x in np.atleast_1d(v)]

    def fill(template: str, p: int, v_ids: list[int] | None) -> list[int]:
        out: list[int] = []
        for w in template.split():
            if w == "{name}":
                out += [int(x) for x in name[p]]
            elif w == "{v}":
                out += v_ids
            else:
                out.append(ix[f"w:{w}"])
        return out

    answer_word = ix["w:Answer:"]

    def qa_pair(p: int, t: int) -> tuple[list[int], list[int]]:
        """(question tokens ending in 'Answer:', answer tokens ending in <eos>)."""
        q = fill(QUESTION_TEMPLATES[t], p, None) + [answer_word]
        return q, value_ids(_ASKED[t], p) + [tok.eos_id]

    # --- paraphrased biographies: n_paraphrases per individual
    bios: list[list[list[int]]] = []
    for p in range(n_people):
        mine = []
        for _ in range(cfg.n_paraphrases):
            order = rng.permutation(len(_ASKED))
            sent: list[int] = []
            for a_i in order:
                a = _ASKED[a_i]
                variants = _SENTENCES[a]
                sent += fill(variants[rng.integers(len(variants))], p, value_ids(a, p))
            mine.append(sent)
        bios.append(mine)

    # --- training rows: one bio row and one QA row per selection
    rows: list[list[int]] = []
    masks: list[list[int]] = []
    kinds: list[int] = []
    persons: list[int] = []
    for p in range(n_people):
        for s in range(int(reps[p])):
            if cfg.biographies:
                body = bios[p][s % cfg.n_paraphrases] + [tok.eos_id]
                rows.append([tok.bos_id] + body)
                masks.append([0] + [1] * len(body))
                kinds.append(0)
                persons.append(p)
            if cfg.qa:
                row, mask = [tok.bos_id], [0]
                for t in rng.permutation(len(QUESTION_TEMPLATES)):
                    q, a = qa_pair(p, int(t))
                    row += q + a
                    mask += [0] * len(q) + [1] * len(a)
                rows.append(row)
                masks.append(mask)
                kinds.append(1)
                persons.append(p)
    T = max(len(r) for r in rows)
    N = len(rows)
    train_tokens = np.full((N, T), tok.pad_id, dtype=np.int32)
    train_mask = np.zeros((N, T), dtype=np.float32)
    for i, (r, mk) in enumerate(zip(rows, masks, strict=True)):
        train_tokens[i, : len(r)] = r
        train_mask[i, : len(mk)] = mk
    perm = rng.permutation(N)
    train_tokens, train_mask = train_tokens[perm], train_mask[perm]
    train_kind = np.asarray(kinds, dtype=np.int8)[perm]
    train_person = np.asarray(persons, dtype=np.int32)[perm]

    # --- evaluation: all individuals x all templates
    prompts, answers, e_group, e_tmpl, e_person = [], [], [], [], []
    for p in range(n_people):
        for t in range(len(QUESTION_TEMPLATES)):
            q, a = qa_pair(p, t)
            prompts.append([tok.bos_id] + q)
            answers.append(a)
            e_group.append(group[p])
            e_tmpl.append(t)
            e_person.append(p)
    P = max(map(len, prompts))
    A = max(map(len, answers))
    ptok = np.full((len(prompts), P), tok.pad_id, dtype=np.int32)
    atok = np.full((len(prompts), A), tok.pad_id, dtype=np.int32)
    for i, (q, a) in enumerate(zip(prompts, answers, strict=True)):
        ptok[i, : len(q)] = q
        atok[i, : len(a)] = a
    ev = EvalSet(
        prompts=ptok,
        prompt_len=np.array([len(q) for q in prompts], dtype=np.int32),
        answer_first=atok[:, 0].copy(),
        answers=atok,
        group=np.asarray(e_group, dtype=np.int32),
        template=np.asarray(e_tmpl, dtype=np.int32),
        person=np.asarray(e_person, dtype=np.int32),
    )
    return BiographyData(
        config=cfg,
        tokenizer=tok,
        train_tokens=train_tokens,
        train_mask=train_mask,
        train_kind=train_kind,
        train_person=train_person,
        eval=ev,
        group=group,
        repetitions=reps,
        attributes=attrs,
    )
