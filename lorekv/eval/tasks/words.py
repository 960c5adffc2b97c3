"""The raw material of the synthetic tasks: word lists, the noise haystack, random keys and values.

Everything here is bundled (no downloads) and drawn from a caller's seeded
:class:`random.Random`, so a sample is reproducible from its seed.
"""

from __future__ import annotations

import random
import re
import uuid
from collections import Counter
from functools import cache
from typing import Literal

from lorekv.eval.tasks.haystack import haystack_sentences

NOISE = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)
"""RULER's "repeat" haystack: these five sentences over and over (read in a cycle)."""

ADJECTIVES = tuple(
    """
    able absent active agile amber ancient angry arctic awake bald bitter black blank bold
    brave brief bright broad brown busy calm careful cheap chilly clean clever cloudy coastal
    cold cosmic crimson crisp curious damp dark dear deep dense dizzy dry dusty eager early
    easy electric empty endless fair faint fancy fast fierce flat fluffy foggy fond formal
    fresh friendly frozen funny gentle giant glad golden grand gray green happy hard hasty
    heavy hidden hollow honest humble hungry icy idle jolly keen kind large lazy little lively
    lonely loud lucky lunar magic mellow merry mighty misty modern narrow neat nervous noble
    noisy odd orange pale patient plain polite proud purple quick quiet rapid rare red rich
    rough round royal rusty sad salty sandy scarlet sharp shiny short silent silver simple
    sleepy slow small smooth soft solar sour spicy steady steep sticky stormy strange strict
    strong sunny super sweet swift tall tame tender thick thin tidy tiny tough upper urban
    vast velvet violet warm wavy weary wet whole wide wild windy wise witty wooden young zany
    """.split()
)

NOUNS = tuple(
    """
    acorn anchor apple arrow badge bakery balloon banana banjo barn basket beach beacon bean
    bear bell bench berry bicycle blanket boat bottle bridge bucket butter button cabin cactus
    camera candle canoe canyon carpet castle cedar chair cherry chimney circus cliff clock
    cloud comet compass cookie coral cotton cradle crater crown cup curtain daisy desert
    diamond dolphin donkey dragon drum eagle engine falcon feather fence ferry fiddle flute
    forest fountain fox garden garlic giraffe glove goat granite grape guitar hammer harbor
    harp hat helmet honey horse island jacket jungle kettle kitten ladder lantern lemon
    library lighthouse lion lizard magnet mango maple marble meadow melon mirror monkey
    mountain needle nest oak ocean olive onion orchard otter owl paddle palace panda parrot
    peach pearl pebble pencil pepper piano pillow pine planet pocket pond potato pumpkin
    puzzle quilt rabbit radio raft rainbow river robot rocket saddle sailor salmon sandal
    scarf shadow shell ship shovel skate sled snail spider spoon squirrel stable star statue
    stone stove sugar summit swan table teapot temple tiger tomato tower tractor trumpet
    tulip tunnel turtle umbrella valley violin wagon walrus whale whistle window wizard wolf
    zebra
    """.split()
)

FUNCTION_WORDS = frozenset(  # left out of the word tasks: too plain to blank or to count
    """about above after again against among another around because been before being below between
    both cannot could does doing during each either every first from further have having here into
    itself itself later least many might more most much must never only other otherwise same should
    since some still such than that their them then there these they this those though through under
    until upon using very were what when where whether which while will with within without would
    your""".split()
)

Kind = Literal["number", "word", "uuid"]


def draw_value(rng: random.Random, kind: Kind) -> str:
    """One random key or value: a 7-digit number, an adjective-noun word (RULER draws words
    such as ``fair-delivery``) or a uuid4 string built from ``rng``'s bits."""
    if kind == "number":
        return str(rng.randint(1_000_000, 9_999_999))
    if kind == "word":
        return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    if kind == "uuid":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"kind must be one of number, word, uuid, got {kind!r}")


def draw_distinct(rng: random.Random, kind: Kind, count: int, used: set[str]) -> list[str]:
    """``count`` values of ``kind``, distinct from each other and from ``used`` (which grows)."""
    if kind == "word" and count + len(used) > len(ADJECTIVES) * len(NOUNS):
        raise ValueError(f"cannot draw {count} distinct words from {len(ADJECTIVES) * len(NOUNS)}")
    values: list[str] = []
    while len(values) < count:
        value = draw_value(rng, kind)
        if value not in used and not any(value in other or other in value for other in values):
            used.add(value)
            values.append(value)
    return values


_CONSONANTS = "bcdfghjklmnprstvz"
_VOWELS = "aeiou"


def made_up_words(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct pronounceable made-up words, all of the form CVCVC (so none is a
    substring of another): RULER's "coded" words for the frequent-words task."""
    space = (len(_CONSONANTS) * len(_VOWELS)) ** 2 * len(_CONSONANTS)
    if count > space // 2:
        raise ValueError(f"cannot draw {count} distinct made-up words (at most {space // 2})")
    seen: set[str] = set()
    words: list[str] = []
    while len(words) < count:
        c1, c2, c3 = (rng.choice(_CONSONANTS) for _ in range(3))
        v1, v2 = (rng.choice(_VOWELS) for _ in range(2))
        word = c1 + v1 + c2 + v2 + c3
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


@cache
def common_word_vocabulary() -> tuple[str, ...]:
    """Distinct lowercase English words for the common-words task: the bundled lists plus the
    words of 4 to 12 letters of the Python reference manual's prose, without function words, sorted."""
    prose = Counter(w for s in haystack_sentences() for w in re.findall(r"\b[a-z]{4,12}\b", s))
    return tuple(sorted((set(ADJECTIVES) | set(NOUNS) | set(prose)) - FUNCTION_WORDS))


def noise_sentences(count: int) -> list[str]:
    """The first ``count`` sentences of the repeated noise haystack."""
    return [NOISE[i % len(NOISE)] for i in range(count)]


@cache
def _prose_words() -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(s.split()) for s in haystack_sentences())


def prose_sentences(start: int, num_words: int) -> list[str]:
    """Sentences of the reference manual's prose from sentence ``start`` on (cycling), holding
    ``num_words`` words in all; the last one is cut short if needed (RULER cuts its essay
    haystack by words too), so the haystack grows a word at a time."""
    pool = _prose_words()
    out: list[str] = []
    left = num_words
    i = start
    while left > 0:
        words = pool[i % len(pool)]
        out.append(" ".join(words[:left]))
        left -= min(left, len(words))
        i += 1
    return out


def insert_at_depths(units: list[str], items: list[str], depths: list[float]) -> list[str]:
    """``units`` with ``items[i]`` inserted at the boundary nearest ``depths[i]`` (a fraction of
    the units, in [0, 1]); items at the same boundary keep their order."""
    slots = sorted(
        ((min(len(units), round(d * len(units))), k) for k, d in enumerate(depths)), key=lambda x: (x[0], x[1])
    )
    out: list[str] = []
    pos = 0
    for slot, k in slots:
        out.extend(units[pos:slot])
        pos = slot
        out.append(items[k])
    out.extend(units[pos:])
    return out
