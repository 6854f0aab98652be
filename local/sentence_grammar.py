"""Template grammars that generate transcripts for the synthesized corpora.

English: a few hundred words in slots of sentence templates, about 8 words a sentence,
so that a small model can learn the words and still meet unseen sentences at test
time. Mandarin: space-segmented words, as in AISHELL-1 transcripts.
"""

from __future__ import annotations

import random
from typing import Iterable, List, Set

_WORDS = {
    "name": """quentin rachel steven ursula wendy xavier yvonne zachary amber bianca cedric daphne
        elliot felix gloria harold ingrid jasper leona miles anna ben clara david emma frank
        grace henry iris jack kate leo mary nina oscar paul rose sam tom vera walter alice
        bruce carol diana edward fiona george helen ivan julia kevin laura martin nora peter
        ruth simon tina victor""",
    "noun": """anchor arrow bakery balloon barrel beard beetle blossom bonnet bowl bracelet branch
        brick broom brush buffalo butterfly cactus canoe canyon captain carrot cart cellar
        chimney circus clock cloak clown comet compass cradle crown crystal curtain dancer
        diamond dolphin donkey eagle engine envelope falcon ferry fiddle flag flute fountain
        fox giant goat goose harp helmet hunter jewel kettle kite knight ladle lemon
        lighthouse lizard magnet mayor melon miller moth mule necklace nest oven owl paddle
        palace parrot peach pearl pebble pepper pirate plum pond potato prince puppet raft
        ring rope sandal scarf scissors shell skate sled snail spider squirrel stool sugar
        swan sword tailor teapot thimble toad tomato trumpet turtle vase wallet weaver wheat
        willow wreath apple basket bicycle bird boat book bottle bridge brother camera
        candle car castle cat chair cloud coat computer cookie cup desk doctor dog door
        dragon drum farmer field flower forest friend garden gate girl glass guitar hammer
        hat horse house island jacket key kitchen ladder lamp letter lion map market mirror
        monkey mountain needle nurse ocean orange painter pencil piano picture pilot planet
        pocket queen rabbit radio river robot rocket sailor school shadow sheep shirt shoe
        singer soldier spoon station stone student table teacher tiger tower town train tree
        truck umbrella village violin wagon wall watch whale window wizard wolf yard baker
        bench blanket bucket button cabin carpet cottage feather fence hill lantern meadow
        pillow puzzle ribbon saddle shovel stream tunnel valley wheel""",
    "plural": """bells buttons clocks feathers gloves hats jars kites lemons marbles needles pebbles
        plates ribbons rings shells spoons tickets toys whistles apples books birds boats
        candles cats chairs cookies dogs flowers horses keys lamps letters maps pencils
        pictures rabbits rocks sheep shoes stars stones tables trees wagons windows coins
        cards boxes""",
    "adjective": """ancient awkward bitter bold calm cheerful chilly clumsy crisp curious dusty eager
        fancy fierce fragile fresh fuzzy graceful grumpy hollow humble icy jolly lonely
        magic muddy noble odd pale polite proud purple rapid rough rusty shiny silent silly
        smooth sour spotted steady sticky striped sunny swift thick thin tidy wild wise big
        small old new red blue green yellow white black bright dark quiet loud happy sad
        heavy light warm cold soft hard tall short young clever brave gentle strange simple
        broken golden silver wooden hungry sleepy busy tiny huge lovely lucky careful famous
        friendly funny narrow wide""",
    "verb_past": """admired bent buried caught collected covered crossed decorated delivered discovered
        dragged emptied filled folded grabbed guarded hugged ignored measured mended noticed
        ordered polished printed repaired rescued shared shook sorted stacked tied traded
        wrapped saw found took painted carried opened closed cleaned bought sold moved
        pushed pulled washed fixed dropped lifted watched followed called visited borrowed
        helped touched counted packed hid chased fed kept""",
    "verb_intransitive": """coughed crawled drifted fainted floated giggled glowed hurried knelt marched paused
        sneezed sighed skipped splashed stumbled swam trembled vanished yawned walked ran
        jumped laughed smiled slept waited danced sang shouted whispered listened worked
        played rested stayed arrived left returned wandered climbed""",
    "adverb": """quickly slowly quietly loudly happily carefully suddenly gently badly early late
        together again often never always""",
    "place": """the park, the beach, the city, the farm, the station, the library, the market, the
        river, the forest, the hospital, the harbor, the museum, the kitchen, the garden,
        the school, the castle, the village, the island""",
    "preposition": """near behind under beside inside across through toward past along""",
    "time": """today, yesterday, tonight, this morning, last night, every day, on monday, on
        friday, in the evening, after lunch, before dinner, at noon, in winter, in spring""",
    "number": """two three four five six seven eight nine ten twelve twenty""",
    "determiner": """the a this that every one""",
}
ENGLISH_TEMPLATES = (
    "{name} {verb_past} the {adjective} {noun} {time}",
    "the {adjective} {noun} {verb_intransitive} {adverb} {preposition} {place}",
    "{name} and {name} {verb_past} {number} {adjective} {plural} at {place}",
    "{determiner} {noun} {verb_intransitive} {preposition} the {adjective} {noun}",
    "{time} {name} {verb_intransitive} to {place} with a {noun}",
    "{name} {verb_past} a {noun} {preposition} the {noun} {adverb}",
    "the {noun} of {name} was very {adjective} {time}",
    "{number} {adjective} {plural} {verb_intransitive} {preposition} the {noun}",
    "why did {name} keep the {adjective} {noun} in {place}",
    "{name} {verb_intransitive} {adverb} while the {noun} {verb_intransitive}",
)


def _choices(text: str) -> List[str]:
    # Slots whose entries have several words list them separated by commas.
    separator = "," if "," in text else None
    return [" ".join(entry.split()) for entry in text.split(separator) if entry.strip()]


_CHOICES = {name: _choices(text) for name, text in _WORDS.items()}


def english_vocabulary() -> Set[str]:
    """Every word the English grammar can produce."""
    words: Set[str] = set()
    for template in ENGLISH_TEMPLATES:
        words.update(w for w in template.split() if not w.startswith("{"))
    for choices in _CHOICES.values():
        for choice in choices:
            words.update(choice.split())
    return words


def english_sentence(rng: random.Random) -> str:
    """One lower-case English sentence of about 8 words."""
    template = rng.choice(ENGLISH_TEMPLATES)
    parts = []
    for token in template.split():
        if token.startswith("{"):
            parts.append(rng.choice(_CHOICES[token[1:-1]]))
        else:
            parts.append(token)
    return " ".join(parts)


def english_sentences(
    count: int, rng: random.Random, exclude: Iterable[str] = ()
) -> List[str]:
    """``count`` distinct sentences, none equal to a sentence in ``exclude``."""
    excluded = set(exclude)
    sentences: List[str] = []
    seen: Set[str] = set()
    attempts = 0
    while len(sentences) < count:
        attempts += 1
        if attempts > 50 * count + 1000:
            raise RuntimeError(
                f"the English grammar could not produce {count} distinct sentences "
                f"(got {len(sentences)}); ask for fewer"
            )
        sentence = english_sentence(rng)
        if sentence in excluded or sentence in seen:
            continue
        seen.add(sentence)
        sentences.append(sentence)
    return sentences


MANDARIN_WORDS = """今天 明天 昨天 我们 你们 他们 北京 上海 城市 公司 市场 经济 发展 政府
    银行 学校 学生 老师 医院 医生 电话 手机 电脑 网络 新闻 记者 消息 问题 情况 工作
    生活 时间 地方 朋友 家庭 孩子 父母 天气 下雨 晴天 汽车 火车 飞机 房子 价格 增长
    下降 提高 需要 认为 表示 已经 正在 开始 继续 完成 参加 举行 会议 比赛 球队 冠军
    记录 文化 历史 科学 技术 研究 项目 中国 世界 国家 人民 服务 安全 环境 保护 水平
    重要 主要 非常 很多 一些 这个 那个 没有 可以 应该 进行 通过 关于 因为 所以 但是""".split()


def mandarin_sentence(rng: random.Random, min_words: int = 4, max_words: int = 8) -> str:
    """Space-segmented Mandarin words, like one line of an AISHELL-1 transcript."""
    return " ".join(rng.choice(MANDARIN_WORDS) for _ in range(rng.randint(min_words, max_words)))


def mandarin_sentences(count: int, rng: random.Random) -> List[str]:
    return [mandarin_sentence(rng) for _ in range(count)]

