"""Offline stand-in for SMolInstruct: deterministic molecule captioning / generation records.

Molecules are assembled from a small fragment grammar (a ring core plus substituents), so every SMILES is
valid by construction and its heavy-atom composition is known exactly; captions describe the structure
(learnable from the SMILES) and add sample-specific facts (a role, a source organism: not derivable from
the structure), which is what a fine-tuned model can memorise. Records carry exactly SMolInstruct's fields.
The same (seed, stream, index) always gives the same record, on every machine (no RDKit needed).
"""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np

GENERATOR_VERSION = "1"

# (name, atoms as SMILES tokens, atoms where a substituent may attach, heavy-atom composition)
_CORES = [
    ("benzene", ["c1", "c", "c", "c", "c", "c1"], [0, 1, 2, 3, 4, 5], {"C": 6}),
    ("pyridine", ["c1", "c", "c", "n", "c", "c1"], [0, 1, 2, 4, 5], {"C": 5, "N": 1}),
    ("cyclohexane", ["C1", "C", "C", "C", "C", "C1"], [0, 1, 2, 3, 4, 5], {"C": 6}),
    ("cyclopentane", ["C1", "C", "C", "C", "C1"], [0, 1, 2, 3, 4], {"C": 5}),
    ("furan", ["c1", "c", "c", "o", "c1"], [0, 1, 2, 4], {"C": 4, "O": 1}),
    ("thiophene", ["c1", "c", "c", "s", "c1"], [0, 1, 2, 4], {"C": 4, "S": 1}),
    ("piperidine", ["C1", "C", "C", "N", "C", "C1"], [0, 1, 2, 4, 5], {"C": 5, "N": 1}),
    ("naphthalene", ["c1", "c", "c", "c2", "c", "c", "c", "c", "c2", "c1"], [0, 1, 2, 4, 5, 6, 7, 9], {"C": 10}),
]

# (name, SMILES as a branch, composition)
_SUBSTITUENTS = [
    ("methyl", "C", {"C": 1}),
    ("ethyl", "CC", {"C": 2}),
    ("propyl", "CCC", {"C": 3}),
    ("isopropyl", "C(C)C", {"C": 3}),
    ("hydroxy", "O", {"O": 1}),
    ("amino", "N", {"N": 1}),
    ("carboxy", "C(=O)O", {"C": 1, "O": 2}),
    ("methoxycarbonyl", "C(=O)OC", {"C": 2, "O": 2}),
    ("carbamoyl", "C(N)=O", {"C": 1, "N": 1, "O": 1}),
    ("chloro", "Cl", {"Cl": 1}),
    ("fluoro", "F", {"F": 1}),
    ("bromo", "Br", {"Br": 1}),
    ("cyano", "C#N", {"C": 1, "N": 1}),
    ("methoxy", "OC", {"C": 1, "O": 1}),
    ("acetyl", "C(C)=O", {"C": 2, "O": 1}),
    ("trifluoromethyl", "C(F)(F)F", {"C": 1, "F": 3}),
    ("nitro", "[N+](=O)[O-]", {"N": 1, "O": 2}),
]

_ROLES = [
    "plant metabolite",
    "antifungal agent",
    "human xenobiotic metabolite",
    "flavouring agent",
    "solvent",
    "antibacterial agent",
    "herbicide",
    "fragrance",
    "anti-inflammatory agent",
    "insecticide",
    "bacterial metabolite",
    "marine metabolite",
    "enzyme inhibitor",
    "antioxidant",
    "food additive",
    "pesticide intermediate",
    "dye precursor",
    "radical scavenger",
    "local anaesthetic",
    "allergen",
]

_SOURCES = [
    "Streptomyces griseus",
    "Penicillium chrysogenum",
    "Artemisia annua",
    "Zea mays",
    "Aspergillus niger",
    "Camellia sinensis",
    "Escherichia coli",
    "Pinus sylvestris",
    "Saccharomyces cerevisiae",
    "Homo sapiens",
    "Arabidopsis thaliana",
    "Ginkgo biloba",
    "Bacillus subtilis",
    "Coffea arabica",
    "Citrus limon",
]

_RELATED = [
    "benzoic acid",
    "phenol",
    "toluene",
    "pyridine",
    "aniline",
    "acetic acid",
    "cyclohexanol",
    "furfural",
    "thiophene",
    "piperidine",
    "naphthalene",
    "salicylic acid",
    "anisole",
    "acetophenone",
]

_NUMBER_WORDS = {
    1: "one",
    2: "two",
    3: "three",
    4: "four",
    5: "five",
    6: "six",
    7: "seven",
    8: "eight",
    9: "nine",
    10: "ten",
    11: "eleven",
    12: "twelve",
    13: "thirteen",
    14: "fourteen",
}

_ELEMENT_NAMES = {
    "C": "carbon",
    "N": "nitrogen",
    "O": "oxygen",
    "S": "sulfur",
    "F": "fluorine",
    "Cl": "chlorine",
    "Br": "bromine",
}

_CAPTION_TEMPLATES = [
    "Describe this molecule: <INPUT>",
    "Please give me some details about this molecule: <INPUT>",
    "What can you tell me about the molecule <INPUT>?",
    "Provide a brief overview of this molecule. <INPUT>",
]

_GENERATION_TEMPLATES = [
    "Give me a molecule that satisfies the conditions outlined in the description: <INPUT>",
    "Create a molecule with the structure as the one described: <INPUT>",
    "Generate a molecule based on this description: <INPUT>",
    "Can you create a molecule that matches the given characteristics? <INPUT>",
]

CORE_TAGS = {
    "molecule_captioning": {"input": ["<SMILES>", "</SMILES>"], "output": ["", ""]},
    "molecule_generation": {"input": ["", ""], "output": ["<SMILES>", "</SMILES>"]},
}

SUPPORTED_TASKS = tuple(CORE_TAGS)


def _rng(seed: int, stream: str, index: int) -> np.random.Generator:
    digest = hashlib.sha256(f"{GENERATOR_VERSION}|{seed}|{stream}|{index}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def make_molecule(rng: np.random.Generator) -> tuple[str, str, Counter]:
    """Return (SMILES, structural description, heavy-atom counts) of a random fragment-built molecule."""
    core_name, atoms, sites, comp = _CORES[rng.integers(len(_CORES))]
    n_subs = int(rng.integers(1, min(3, len(sites)) + 1))
    chosen_sites = sorted(rng.choice(sites, size=n_subs, replace=False).tolist())
    subs = [_SUBSTITUENTS[i] for i in rng.integers(len(_SUBSTITUENTS), size=n_subs)]
    counts = Counter(comp)
    tokens = list(atoms)
    prefix = ""
    for site, (_, smi, sub_comp) in zip(chosen_sites, subs):
        counts.update(sub_comp)
        if site == 0:  # a substituent on the first ring atom is written before the ring
            prefix = _as_prefix(smi)
        else:
            tokens[site] = f"{tokens[site]}({smi})"
    smiles = prefix + "".join(tokens)
    sub_names = [name for name, _, _ in subs]
    tally = Counter(sub_names)
    parts = [
        f"{_NUMBER_WORDS.get(c, str(c))} {n} groups" if c > 1 else f"{_a(n)} group" for n, c in sorted(tally.items())
    ]
    description = f"{_a(core_name)} carrying {_join(parts)}"
    return smiles, description, counts


def _as_prefix(branch: str) -> str:
    # A substituent written before the ring must end on the atom bonded to the ring.
    prefixes = {
        "C": "C",
        "CC": "CC",
        "CCC": "CCC",
        "C(C)C": "CC(C)",
        "O": "O",
        "N": "N",
        "C(=O)O": "OC(=O)",
        "C(=O)OC": "COC(=O)",
        "C(N)=O": "NC(=O)",
        "Cl": "Cl",
        "F": "F",
        "Br": "Br",
        "C#N": "N#C",
        "OC": "CO",
        "C(C)=O": "CC(=O)",
        "C(F)(F)F": "FC(F)(F)",
        "[N+](=O)[O-]": "[O-][N+](=O)",
    }
    return prefixes[branch]


def _composition_text(counts: Counter) -> str:
    parts = []
    for element in ("C", "N", "O", "S", "F", "Cl", "Br"):
        n = counts.get(element, 0)
        if n:
            word = _NUMBER_WORDS.get(n, str(n))
            parts.append(f"{word} {_ELEMENT_NAMES[element]} atom{'s' if n > 1 else ''}")
    return _join(parts)


def make_caption(rng: np.random.Generator, description: str, counts: Counter) -> str:
    sentences = [f"The molecule is {description}.", f"It contains {_composition_text(counts)}."]
    facts = [
        f"It has a role as {_a(_ROLES[rng.integers(len(_ROLES))])}.",
        f"It has been isolated from {_SOURCES[rng.integers(len(_SOURCES))]}.",
        f"It is functionally related to {_RELATED[rng.integers(len(_RELATED))]}.",
    ]
    keep = rng.permutation(len(facts))[: int(rng.integers(1, len(facts) + 1))]
    sentences += [facts[i] for i in sorted(keep)]
    return " ".join(sentences)


def _wrap(text: str, tags: list[str]) -> str:
    left, right = tags
    return f"{left} {text} {right}" if left or right else text


def make_record(task: str, seed: int, stream: str, index: int) -> dict:
    """One SMolInstruct-format record (all the loading script's fields plus `sample_id`)."""
    if task not in CORE_TAGS:
        raise ValueError(f"the offline generator supports tasks {list(SUPPORTED_TASKS)}, not {task!r}")
    rng = _rng(seed, f"{stream}|{task}", index)
    smiles, description, counts = make_molecule(rng)
    caption = make_caption(rng, description, counts)
    tags = CORE_TAGS[task]
    if task == "molecule_captioning":
        raw_input, raw_output, templates = smiles, caption, _CAPTION_TEMPLATES
    else:
        raw_input, raw_output, templates = caption, smiles, _GENERATION_TEMPLATES
    template = templates[int(rng.integers(len(templates)))]
    return {
        "input": template.replace("<INPUT>", _wrap(raw_input, tags["input"])),
        "output": _wrap(raw_output, tags["output"]),
        "raw_input": raw_input,
        "raw_output": raw_output,
        "split": "train",
        "task": task,
        "input_core_tag_left": tags["input"][0],
        "input_core_tag_right": tags["input"][1],
        "output_core_tag_left": tags["output"][0],
        "output_core_tag_right": tags["output"][1],
        "target": raw_output,
        "sample_id": f"synthetic/{stream}/{task}/{index:06d}",
    }


def generate_records(tasks: list[str] | tuple[str, ...], n: int, *, seed: int = 0, stream: str = "audit") -> list[dict]:
    """n records, tasks interleaved round-robin. Different `stream`s never share a record."""
    return [make_record(tasks[i % len(tasks)], seed, stream, i) for i in range(n)]
