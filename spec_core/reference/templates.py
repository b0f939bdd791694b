"""Every literal English fragment the tasks use. Questions have paraphrases (picked by rng);
answers have exactly one template each, so reference answers are regular enough to draft.
`tasks.all_words` reads this module, so text written anywhere else would escape its coverage."""

from __future__ import annotations

QUESTIONS: dict[str, tuple[str, ...]] = {
    # general_vqa
    "colour_at": ("What colour is the {shape} {pos}?", "Which colour does the {shape} {pos} have?",
                  "Tell me the colour of the {shape} {pos}."),
    "shape_at": ("What shape is {pos}?", "Which shape can you see {pos}?",
                 "What kind of shape is {pos}?"),
    "what_at": ("What is {pos}?", "What can you see {pos}?", "Is there anything {pos}?"),
    "count": ("How many objects are there?", "How many objects are in the image?",
              "Count the objects in the image."),
    "exists": ("Is there a {colour} {shape}?", "Can you see a {colour} {shape}?",
               "Does the image contain a {colour} {shape}?"),
    "relation": ("What is directly {rel} the {colour} {shape}?",
                 "Which object is directly {rel} the {colour} {shape}?",
                 "What do you see directly {rel} the {colour} {shape}?"),
    # text_vqa
    "sign_word": ("What word is written on the sign?", "What does the sign say?",
                  "Read the word on the sign.", "Which word can you read on the sign?"),
    "sign_where": ("Where is the sign?", "Where in the image is the sign?",
                   "In which part of the image is the sign?"),
    "sign_length": ("How many letters does the word on the sign have?",
                    "How long is the word on the sign?", "Count the letters on the sign."),
    "sign_first": ("What is the first letter of the word on the sign?",
                   "Which letter does the word on the sign start with?"),
    # captioning
    "caption": ("Describe the image in detail.", "Give a detailed description of the image.",
                "What is in this image? Describe it in detail.",
                "Write a detailed caption for the image."),
    # chart_vqa
    "tallest": ("Which bar is the tallest?", "Which bar has the highest value?",
                "Which bar is highest?"),
    "shortest": ("Which bar is the shortest?", "Which bar has the lowest value?",
                 "Which bar is lowest?"),
    "n_bars": ("How many bars are in the chart?", "How many bars does the chart have?",
               "Count the bars in the chart."),
    "taller": ("Is bar {a} taller than bar {b}?", "Is the value of bar {a} higher than bar {b}?",
               "Does bar {a} reach higher than bar {b}?"),
    "bar_value": ("What is the value of bar {a}?", "What value does bar {a} show?",
                  "Roughly how high is bar {a}?"),
    "bar_colour": ("What colour are the bars?", "Which colour are the bars in the chart?"),
    # reasoning, objects
    "r_sum": ("If you add the number of {colour} objects to the number of {shapes}, what do you "
              "get?",
              "What is the number of {colour} objects plus the number of {shapes}?"),
    "r_diff": ("What is the difference between the number of {colour} objects and the number of "
               "{shapes}?",
               "How far apart are the number of {colour} objects and the number of {shapes}?"),
    "r_not": ("How many objects are not {colour}?", "Count the objects that are not {colour}."),
    # reasoning, charts
    "r_sum2": ("What is the sum of bar {a} and bar {b}?", "What do bar {a} and bar {b} add up to?"),
    "r_sum3": ("What is the total of bars {a}, {b} and {c}?",
               "What do bars {a}, {b} and {c} add up to?"),
    "r_bar_diff": ("How much taller is bar {a} than bar {b}?",
                   "By how much does bar {a} exceed bar {b}?"),
    "r_totals": ("Which is larger, bar {a} plus bar {b} or bar {c} plus bar {d}, and by how much?",
                 "Compare bar {a} plus bar {b} with bar {c} plus bar {d}. What is the difference?"),
}

ANSWERS: dict[str, str] = {
    "colour_at": "The {shape} {pos} is {colour}.",
    "shape_at": "The object {pos} is a {shape}.",
    "what_at": "There is a {obj} {pos}.",
    "what_at_none": "There is nothing {pos}.",
    "count_one": "There is 1 object.",
    "count": "There are {n} objects.",
    "exists_yes": "Yes, there is a {colour} {shape} {pos}.",
    "exists_no": "No, there is no {colour} {shape}.",
    "relation": "The {obj} is directly {rel} the {colour} {shape}.",
    "sign_word": "The sign says {word}.",
    "sign_where": "The sign is across the {row} of the image.",
    "sign_length": "The word {word} has {n} letters.",
    "sign_first": "The word {word} starts with the letter {letter}.",
    "tallest": "Bar {a} is the tallest.",
    "shortest": "Bar {a} is the shortest.",
    "n_bars": "The chart has {n} bars.",
    "taller_yes": "Yes, bar {a} is taller than bar {b}.",
    "taller_no": "No, bar {a} is shorter than bar {b}.",
    "bar_value": "Bar {a} is about {v}.",
    "bar_colour": "The bars are {colour}.",
    "answer": "The answer is {n}.",
}

CAPTION: dict[str, str] = {
    "open_one": "The image shows 1 object on a {bg} background.",
    "open": "The image shows {n} objects on a {bg} background.",
    "open_sign_one": "The image shows 1 object and a sign on a {bg} background.",
    "open_sign": "The image shows {n} objects and a sign on a {bg} background.",
    "sign": "A white sign runs across the {row} of the image, and it says {word} in black letters.",
    "row_sign": "The {row} row holds the sign.",
    "row_none": "The {row} row has no objects.",
    "row_one": "The {row} row has 1 object.",
    "row_many": "The {row} row has {n} objects.",
    "object": "{Pos} there is a {obj}.",
    "colours_one": "The only object colour is {colour}.",
    "colours": "The object colours are {colours}.",
    "close": "Everything else is plain {bg} background.",
}

REASONING: dict[str, str] = {
    "all_objects": "There are {n} objects in the image: {objs}.",
    "all_objects_one": "There is 1 object in the image: {objs}.",
    "first_colour": "First I count the {colour} objects.",
    "next_shapes": "Next I count the {shapes}.",
    "first_all": "First I count all objects, which gives {n}.",
    "next_colour": "Next I count the {colour} objects.",
    "colour_many": "The {colour} objects are {objs}.",
    "colour_one": "The only {colour} object is {objs}.",
    "colour_none": "There are no {colour} objects.",
    "shapes_many": "The {shapes} are {objs}.",
    "shapes_one": "The only {shape} is {objs}.",
    "shapes_none": "There are no {shapes}.",
    "makes": "That makes {n}.",
    "plus": "Adding the two counts, {a} plus {b} is {c}.",
    "diff": "The larger count is {a} and the smaller count is {b}, so the difference is {a} minus "
            "{b}, which is {c}.",
    "not": "The objects that are not {colour} are {a} minus {b}, which is {c}.",
    "chart_open": "The chart has {n} {colour} bars labelled {labels}, and I read each bar to the "
                  "nearest ten.",
    "bar": "Bar {a} is about {v}.",
    "needs": "The question asks about {bars}, so I only need those values.",
    "sum": "Adding them, {terms} is {s}.",
    "minus": "Bar {a} is taller, and {va} minus {vb} is {d}.",
    "total": "For the {which} pair, bar {a} plus bar {b} is {va} plus {vb}, which is {s}.",
    "larger": "The {which} pair is larger, and {s1} minus {s2} is {d}.",
    "equal": "Both pairs are equal, so the difference is 0.",
}

# Connective words used when templates are joined ("a, b and c", "bar a and bar b").
GLUE: tuple[str, ...] = ("and", "the", "first", "second", "bar", "bars", "plus", "object",
                         "objects")
