"""Fixed vocabulary of the reference world: palettes, shapes, grid cells, sign words, bar labels."""

from __future__ import annotations

# Object / bar colours. Pairwise RGB distance >= ~95 (also from every background, white and black)
# so the nearest-palette classification of a textured pixel stays unambiguous.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (50, 90, 230),
    "yellow": (245, 225, 40),
    "purple": (140, 60, 190),
    "orange": (250, 130, 20),
    "cyan": (40, 210, 220),
    "pink": (250, 130, 200),
}
COLOUR_NAMES: tuple[str, ...] = tuple(COLOURS)

# Muted backgrounds, never used for objects. Light ones get black chart text, dark ones white.
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "gray": (150, 150, 150),
    "beige": (215, 205, 175),
    "navy": (30, 40, 90),
    "olive": (95, 100, 45),
    "brown": (105, 70, 50),
}
BACKGROUND_NAMES: tuple[str, ...] = tuple(BACKGROUNDS)

WHITE: tuple[int, int, int] = (255, 255, 255)
BLACK: tuple[int, int, int] = (0, 0, 0)

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond", "star", "cross", "ring")
SHAPE_PLURALS: dict[str, str] = {s: s + "s" for s in SHAPES} | {"cross": "crosses"}

SIZES: tuple[str, ...] = ("small", "large")
# Object extent as a fraction of the grid cell side.
SIZE_FRACTIONS: dict[str, float] = {"small": 0.45, "large": 0.8}

# 3x3 grid, row-major: cell index = 3 * row + column.
GRID: int = 3
CELL_NAMES: tuple[str, ...] = (
    "top left", "top", "top right",
    "left", "center", "right",
    "bottom left", "bottom", "bottom right",
)
# How a cell reads inside a sentence ("the circle in the top left", "the star at the top").
CELL_PHRASES: tuple[str, ...] = (
    "in the top left", "at the top", "in the top right",
    "on the left", "in the center", "on the right",
    "in the bottom left", "at the bottom", "in the bottom right",
)
ROW_NAMES: tuple[str, ...] = ("top", "middle", "bottom")

NUMBER_WORDS: tuple[str, ...] = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
)

BAR_LABELS: tuple[str, ...] = ("A", "B", "C", "D", "E", "F")
MIN_BARS: int = 3
MAX_BARS: int = len(BAR_LABELS)

LETTERS: str = "abcdefghijklmnopqrstuvwxyz"

# Sign words: sorted, distinct, lowercase, 3-6 letters; no colour, shape or size names so a
# sign never reads like an attribute.
WORDS: tuple[str, ...] = (
    "anchor", "apple", "arrow", "badge", "bagel", "baker", "bamboo", "banana", "basket", "beach",
    "bear", "bell", "bench", "berry", "bird", "bison", "blade", "blimp", "bloom", "board", "boat",
    "bone", "book", "boot", "bottle", "bread", "brick", "bridge", "brush", "bucket", "butter",
    "cabin", "cable", "cactus", "cake", "camel", "camera", "candle", "candy", "canoe", "card",
    "carpet", "carrot", "castle", "chair", "chalk", "cheese", "cherry", "chess", "cliff", "clock",
    "cloud", "coast", "coat", "cobra", "coin", "comet", "cookie", "coral", "corn", "couch", "crab",
    "crane", "crown", "cup", "daisy", "dance", "desk", "dish", "dog", "donkey", "door", "dragon",
    "dream", "drum", "duck", "dune", "eagle", "earth", "elbow", "fairy", "falcon", "fan", "farm",
    "fence", "fern", "field", "fish", "flag", "flame", "flower", "flute", "fog", "forest", "fork",
    "fox", "frog", "fruit", "garden", "gate", "ghost", "gift", "glass", "glove", "goat", "goose",
    "grape", "grass", "guitar", "hammer", "hand", "harbor", "hat", "hawk", "hill", "hippo",
    "honey", "horse", "house", "ice", "igloo", "island", "jacket", "jam", "jar", "jelly", "jet",
    "jewel", "jungle", "kettle", "key", "king", "kite", "knife", "koala", "ladder", "lake", "lamp",
    "leaf", "lemon", "lion", "lizard", "llama", "lock", "lumber", "magnet", "mango", "map",
    "maple", "marble", "market", "meadow", "melon", "milk", "mirror", "monkey", "moon", "moose",
    "moth", "mouse", "muffin", "mug", "nail", "needle", "nest", "night", "noodle", "nut", "oak",
    "ocean", "onion", "orbit", "otter", "owl", "paint", "pan", "panda", "paper", "parrot", "party",
    "peach", "pear", "pearl", "pencil", "pepper", "piano", "pickle", "pig", "pillow", "pilot",
    "pine", "pizza", "planet", "plant", "plate", "plum", "pony", "pool", "potato", "puppy",
    "puzzle", "queen", "quilt", "rabbit", "radio", "raft", "rain", "ribbon", "river", "road",
    "robot", "rock", "rocket", "roof", "rope", "saddle", "sail", "salad", "salt", "sand", "scarf",
    "sea", "seed", "shark", "sheep", "shell", "ship", "shoe", "skate", "sled", "sloth", "snail",
    "snake", "snow", "sock", "soup", "spider", "sponge", "spoon", "squid", "stone", "storm",
    "straw", "sugar", "summer", "sun", "swan", "sword", "table", "tent", "thorn", "tiger", "toast",
    "tomato", "tooth", "torch", "tower", "toy", "train", "tree", "trout", "truck", "tulip",
    "tunnel", "turtle", "valley", "van", "vase", "vine", "violin", "wagon", "wall", "walrus",
    "water", "wave", "whale", "wheel", "wind", "window", "wizard", "wolf", "wood", "yacht", "yak",
    "yarn", "zebra", "zipper", "zoo",
)
WORD_INDEX: dict[str, int] = {w: i for i, w in enumerate(WORDS)}

# Words a question names and its answer repeats ("What colour is the cross ..." -> "The cross ...
# is blue"), or that an answer reads from the image: shapes, colours, sign words.
CONTENT_WORDS: frozenset[str] = frozenset(SHAPES) | frozenset(COLOUR_NAMES) | frozenset(WORDS)
