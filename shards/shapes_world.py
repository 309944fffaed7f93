"""The synthetic "shapes world": seeded scenes of coloured shapes, their captions and prose.

It is the embedded demo corpus. Scenes are built so that both directions of cross-modal use are
learnable and measurable: each mentioned object's colour appears once in its caption (so a masked
colour word can only be recovered from the image; a caption names only objects at least half in
view), and some objects are drawn *covered* by a grey cloth, so their category exists only in the
caption (a masked covered region can only be classified from language).
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import astuple, dataclass, field

import numpy as np
from PIL import Image, ImageDraw

CATEGORIES = ["circle", "square", "triangle", "star", "diamond", "hexagon", "cross", "heart"]
# Class id 0 is the background, as in Visual Genome's 1601-class detector vocabulary.
CLASS_NAMES = ["__background__", *CATEGORIES]
COLOURS = {
    "red": (214, 39, 40),
    "green": (44, 160, 44),
    "blue": (31, 90, 220),
    "yellow": (240, 205, 30),
    "purple": (148, 60, 189),
    "orange": (250, 135, 20),
}
# Object side as a fraction of the image's shorter side.
SIZES = {"small": (0.13, 0.19), "medium": (0.23, 0.30), "large": (0.36, 0.45)}
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight"]


@dataclass
class ShapeObject:
    category: str
    colour: str
    size: str
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in pixels
    covered: bool = False  # drawn under a grey cloth: category visible only through language

    @property
    def class_id(self) -> int:
        return CLASS_NAMES.index(self.category)

    @property
    def centre(self) -> tuple[float, float]:
        x1, y1, x2, y2 = self.box
        return (x1 + x2) / 2, (y1 + y2) / 2

    def phrase(self) -> str:
        """How a caption names this object; a covered object's colour cannot be seen."""
        if self.covered:
            return f"a {self.size} covered {self.category}"
        return f"a {self.size} {self.colour} {self.category}"


@dataclass
class Scene:
    width: int
    height: int
    background: tuple[int, int, int]
    objects: list[ShapeObject] = field(default_factory=list)


def _polygon(category: str, box: tuple[float, float, float, float]) -> list[tuple[float, float]] | None:
    x1, y1, x2, y2 = box
    cx, cy, r = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2
    if category == "triangle":
        return [(cx, y1), (x2, y2), (x1, y2)]
    if category == "diamond":
        return [(cx, y1), (x2, cy), (cx, y2), (x1, cy)]
    if category == "hexagon":
        return [(cx + r * math.cos(math.pi / 3 * k), cy + r * math.sin(math.pi / 3 * k)) for k in range(6)]
    if category == "star":
        return [
            (cx + (r if k % 2 == 0 else r * 0.42) * math.sin(math.pi / 5 * k),
             cy - (r if k % 2 == 0 else r * 0.42) * math.cos(math.pi / 5 * k))
            for k in range(10)
        ]
    if category == "cross":
        t = r / 3
        return [(cx - t, y1), (cx + t, y1), (cx + t, cy - t), (x2, cy - t), (x2, cy + t), (cx + t, cy + t),
                (cx + t, y2), (cx - t, y2), (cx - t, cy + t), (x1, cy + t), (x1, cy - t), (cx - t, cy - t)]
    return None


def _draw_object(draw: ImageDraw.ImageDraw, obj: ShapeObject, ink=None) -> None:
    """Draws obj; with `ink`, every pixel it covers in that one colour (its silhouette)."""
    x1, y1, x2, y2 = obj.box
    if obj.covered:
        # A grey cloth with folds: same box, no colour and no outline of the shape beneath.
        draw.rounded_rectangle(obj.box, radius=(x2 - x1) / 6, fill=ink or (128, 128, 128), outline=ink or (90, 90, 90))
        for k in range(1, 4):
            x = x1 + (x2 - x1) * k / 4
            draw.line([(x, y1 + 2), (x, y2 - 2)], fill=ink or (105, 105, 105), width=1)
        return
    fill = ink or COLOURS[obj.colour]
    outline = ink or tuple(int(c * 0.6) for c in fill)
    if obj.category == "circle":
        draw.ellipse(obj.box, fill=fill, outline=outline, width=2)
    elif obj.category == "square":
        draw.rectangle(obj.box, fill=fill, outline=outline, width=2)
    elif obj.category == "heart":
        w, h = x2 - x1, y2 - y1
        draw.ellipse((x1, y1, x1 + w * 0.55, y1 + h * 0.55), fill=fill)
        draw.ellipse((x1 + w * 0.45, y1, x2, y1 + h * 0.55), fill=fill)
        draw.polygon([(x1 + w * 0.02, y1 + h * 0.38), (x2 - w * 0.02, y1 + h * 0.38), ((x1 + x2) / 2, y2)],
                     fill=fill)
    else:
        draw.polygon(_polygon(obj.category, obj.box), fill=fill, outline=outline)


def sample_scene(rng: random.Random, *, min_side: int = 128, max_side: int = 320,
                 min_objects: int = 2, max_objects: int = 8, covered_prob: float = 0.15) -> Scene:
    width, height = rng.randint(min_side, max_side), rng.randint(min_side, max_side)
    base = rng.randint(215, 245)
    scene = Scene(width, height, (base, base - rng.randint(0, 12), base - rng.randint(0, 20)))
    short = min(width, height)
    for _ in range(rng.randint(min_objects, max_objects)):
        size = rng.choice(list(SIZES))
        side = short * rng.uniform(*SIZES[size])
        x1, y1 = rng.uniform(0, width - side), rng.uniform(0, height - side)
        scene.objects.append(ShapeObject(
            category=rng.choice(CATEGORIES), colour=rng.choice(list(COLOURS)), size=size,
            box=(round(x1, 1), round(y1, 1), round(x1 + side, 1), round(y1 + side, 1)),
            covered=rng.random() < covered_prob,
        ))
    return scene


def render(scene: Scene, rng: random.Random) -> Image.Image:
    image = Image.new("RGB", (scene.width, scene.height), scene.background)
    draw = ImageDraw.Draw(image)
    # A little texture, so the background is not a constant the detector can memorise.
    for _ in range(scene.width * scene.height // 400):
        x, y = rng.randrange(scene.width), rng.randrange(scene.height)
        shade = rng.randint(-18, 18)
        draw.point((x, y), fill=tuple(max(0, min(255, c + shade)) for c in scene.background))
    for obj in scene.objects:  # later objects occlude earlier ones
        _draw_object(draw, obj)
    return image


def visible_fractions(scene: Scene) -> list[float]:
    """Per object, the fraction of its drawn pixels that no later object draws over (1: in full view, 0:
    hidden): what of it an image shows, however good the detector."""
    # every caption of a scene asks again (~10 times a scene in the demo corpus: half its build time drawing the same
    # silhouettes); the answer depends on the size and the objects only, so it is kept by their values
    key = (scene.width, scene.height, tuple(astuple(o) for o in scene.objects))
    return list(_visible_fractions(key))


@functools.lru_cache(maxsize=4096)
def _visible_fractions(key: tuple) -> tuple[float, ...]:
    width, height, objects = key
    scene = Scene(width, height, (0, 0, 0), [ShapeObject(*fields) for fields in objects])
    seen = np.full((scene.height, scene.width), -1)  # the index of the last object drawn at each pixel
    area = []
    for k, obj in enumerate(scene.objects):
        silhouette = Image.new("1", (scene.width, scene.height), 0)
        _draw_object(ImageDraw.Draw(silhouette), obj, ink=1)
        drawn = np.asarray(silhouette, dtype=bool)
        area.append(int(drawn.sum()))
        seen[drawn] = k
    counts = np.bincount(seen.ravel() + 1, minlength=len(scene.objects) + 1)[1:]
    return tuple(float(c / a) if a else 0.0 for c, a in zip(counts, area))


def relation(a: ShapeObject, b: ShapeObject) -> str:
    """The spatial relation of a to b that the picture shows most clearly."""
    (ax, ay), (bx, by) = a.centre, b.centre
    dx, dy = ax - bx, ay - by
    if abs(dx) >= abs(dy):
        return "left of" if dx < 0 else "right of"
    return "above" if dy < 0 else "below"


# A caption names an object only if at least half of it is in view. Corpora built before (session 15) named any
# object: 9% of their held-out colour words were of objects mostly hidden by later ones, which no model can read
# off the image (docs/ABLATION.md); 0 rebuilds them.
CAPTION_MIN_VISIBLE = 0.5


def caption(scene: Scene, rng: random.Random, mark=None, min_visible: float = CAPTION_MIN_VISIBLE
            ) -> tuple[str, list[int]]:
    """A caption naming some of the scene's objects; returns it and the indices of the objects named.

    `mark(target, text)` may wrap each mention, as Flickr30k Entities marks phrases: target is an
    object index, "all" (a mention of every shape) or None (a mention of no box); the words and the
    random draws are the same with or without it. Only objects of which at least `min_visible` is in
    view (`visible_fractions`; a cloth counts as seen) are named, as a person captions what they see;
    the last object drawn is always in full view. With 0 the draws are those of corpora built before."""
    m = mark or (lambda target, text: text)
    objs = scene.objects
    n = len(objs)
    seen = [k for k, f in enumerate(visible_fractions(scene))
            if f >= min_visible] if min_visible > 0 else list(range(n))
    form = rng.random()
    if len(seen) >= 2 and form < 0.55:
        i, j = rng.sample(seen, 2)
        text = f"{m(i, objs[i].phrase())} {relation(objs[i], objs[j])} {m(j, objs[j].phrase())}"
        named = [i, j]
        if len(seen) >= 3 and rng.random() < 0.4:
            k = rng.choice([x for x in seen if x not in named])
            text += f" and {m(k, objs[k].phrase())} {relation(objs[k], objs[j])} {m(j, 'it')}"
            named.append(k)
    elif form < 0.8:
        named = rng.sample(seen, min(len(seen), rng.randint(1, 3)))
        listed = [m(i, objs[i].phrase()) for i in named]
        joined = listed[0] if len(listed) == 1 else ", ".join(listed[:-1]) + " and " + listed[-1]
        text = f"{m('all', f'{NUMBER_WORDS[n]} shapes')} including {joined}"
    else:
        named = [rng.choice(seen)]
        where = "on the left" if objs[named[0]].centre[0] < scene.width / 2 else "on the right"
        text = f"{m(named[0], objs[named[0]].phrase())} {where} among {m(None, f'{NUMBER_WORDS[n - 1]} other shapes')}"
    return text, named


# --- text-only corpus: long, complex sentences about the same world, no image ---------------------

_PEOPLE = ["the painter", "a curious child", "the old carpenter", "my grandmother", "the museum guide",
           "a travelling merchant", "the young architect", "our neighbour", "the school teacher",
           "a quiet librarian", "the village baker", "an exhausted student"]
_PLACES = ["the market square", "the northern gallery", "a small workshop", "the harbour", "the attic",
           "the railway station", "the botanical garden", "a crowded classroom", "the cathedral steps"]
_TIMES = ["the long winter", "the first morning of spring", "the harvest festival", "the storm last year",
          "the night of the fire", "the summer holidays", "the old king's reign"]
_ADJ = ["bright", "faded", "enormous", "delicate", "peculiar", "ancient", "polished", "crooked", "heavy"]
_VERB = ["carried", "painted", "discovered", "repaired", "hid", "described", "measured", "sold", "arranged"]
_REASON = ["because nobody else believed that it mattered", "although the light was already fading",
           "since the instructions had been lost", "while everyone else argued about the price",
           "as if the whole town depended on it", "even though the rain had not stopped for days"]


def _shape_np(rng: random.Random) -> str:
    return f"{rng.choice(_ADJ)} {rng.choice(list(COLOURS))} {rng.choice(CATEGORIES)}"


def prose_sentence(rng: random.Random) -> str:
    templates = [
        "Although {p} {v} the {s} that stood near {pl} during {t}, nobody could explain why every "
        "{c} in the room seemed {a} afterwards.",
        "When {p} finally reached {pl}, the {s} that had been {v} by strangers was already waiting, "
        "{r}.",
        "It was during {t} that {p}, who had never {v} anything larger than a {c}, decided to build "
        "a {s} for {pl}.",
        "{P} said that the {s} was worth more than all the {c}s in {pl}, {r}, and the argument "
        "lasted until {t}.",
        "Because the {s} had been {v} twice before {t}, {p} kept it in {pl}, where it remained "
        "{a} and almost forgotten.",
        "Nobody who visited {pl} after {t} could forget the {s}, which {p} had {v} with such care "
        "that even the {a} {c} beside it looked ordinary.",
    ]
    p = rng.choice(_PEOPLE)
    text = rng.choice(templates).format(
        p=p, P=p[0].upper() + p[1:], v=rng.choice(_VERB), s=_shape_np(rng), pl=rng.choice(_PLACES),
        t=rng.choice(_TIMES), c=rng.choice(CATEGORIES), a=rng.choice(_ADJ), r=rng.choice(_REASON))
    return text[0].upper() + text[1:]


def prose_paragraph(rng: random.Random, min_sentences: int = 3, max_sentences: int = 7) -> str:
    return " ".join(prose_sentence(rng) for _ in range(rng.randint(min_sentences, max_sentences)))


# --- visual questions about a scene (the demo's VQG_COCO-format data) ------------------------------

def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _plural(category: str) -> str:
    return category + ("es" if category.endswith("ss") else "s")


def questions(scene: Scene, rng: random.Random, k: int = 5) -> list[str]:
    """Up to k distinct questions a person could ask about the picture, each answerable from it; some
    name objects the caption may not mention, so the image is worth looking at."""
    objs = scene.objects
    visible = [o for o in objs if not o.covered]
    pool: list[str] = ["how many shapes are there?"]
    by_category: dict[str, list[ShapeObject]] = {}
    for o in visible:
        by_category.setdefault(o.category, []).append(o)
    for category, group in by_category.items():
        if len(group) == 1:
            pool.append(f"what color is the {category}?")
        else:
            pool.append(f"how many {_plural(category)} are there?")
    colours = {}
    for o in visible:
        colours.setdefault(o.colour, []).append(o)
    for colour, group in colours.items():
        if len(group) == 1:
            pool.append(f"what shape is {colour}?")
        pool.append(f"is there {_article(colour)} {colour} {group[0].category}?")
    if any(o.covered for o in objs):
        pool.append("what is under the cloth?")
    if len(visible) >= 2:
        a, b = rng.sample(visible, 2)
        pool.append(f"what is {relation(a, b)} the {b.colour} {b.category}?")
        pool.append(f"is the {a.category} {relation(a, b)} the {b.category}?")
    biggest = max(objs, key=lambda o: o.box[2] - o.box[0])
    if not biggest.covered:
        pool.append("what is the largest shape?")
    pool = list(dict.fromkeys(pool))
    return rng.sample(pool, min(k, len(pool)))
