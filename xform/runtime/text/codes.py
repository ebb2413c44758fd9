"""Language codes as models write them (NLLB's fra_Latn, mBART-50's fr_XX, M2M100's fr, Marian's
fra) reduced to the language they name, ISO 639-1 where it has one: what the segmenter and the
language identifier speak. A table, not rules: ISO 639-3 to 639-1 for the languages py3langid
identifies (from ISO 639 via pycountry), with the individual languages NLLB writes for a macro
language (arb for Arabic, zsm for Malay, ...)."""
from __future__ import annotations

import re

ISO3_TO_1 = dict(pair.split(":") for pair in (
    "afr:af amh:am ara:ar asm:as aze:az bel:be bul:bg ben:bn bre:br bos:bs cat:ca ces:cs cym:cy dan:da deu:de "
    "ell:el eng:en epo:eo spa:es est:et eus:eu fas:fa fin:fi fra:fr fry:fy gle:ga gla:gd glg:gl guj:gu hau:ha "
    "heb:he hin:hi hrv:hr hat:ht hun:hu hye:hy ind:id ibo:ig isl:is ita:it jpn:ja jav:jv kat:ka kaz:kk khm:km "
    "kan:kn kor:ko kur:ku kir:ky lat:la lug:lg lin:ln lao:lo lit:lt lav:lv mlg:mg mkd:mk mal:ml mon:mn mar:mr "
    "msa:ms mya:my nep:ne nld:nl nor:no orm:om ori:or pan:pa pol:pl pus:ps por:pt que:qu ron:ro rus:ru san:sa "
    "sin:si slk:sk slv:sl som:so sqi:sq srp:sr swe:sv swa:sw tam:ta tel:te tha:th tgl:tl tur:tr uig:ug ukr:uk "
    "urd:ur uzb:uz vie:vi xho:xh yor:yo zho:zh zul:zu dzo:dz kin:rw sme:se sna:sn sot:st arg:an fao:fo ltz:lb "
    "wln:wa bak:ba mlt:mt nno:nn oci:oc tgk:tg tuk:tk tat:tt vol:vo "
    # ISO 639-2/B codes and the individual languages NLLB and OPUS write for a macro language
    "fre:fr ger:de dut:nl gre:el chi:zh cze:cs rum:ro slo:sk per:fa arm:hy geo:ka ice:is mac:mk may:ms alb:sq "
    "baq:eu bur:my wel:cy arb:ar zsm:ms pes:fa prs:fa nob:no npi:ne khk:mn azj:az azb:az uzn:uz plt:mg gaz:om "
    "als:sq swh:sw lvs:lv ekk:et kmr:ku ckb:ku quy:qu cmn:zh yue:yue ydd:yi fil:tl").split())

CODE = re.compile(r"[A-Za-z]{2,3}")


def base_language(code: str) -> str:
    """The language a model's code names: its first 2-3 letters case-folded (fra_Latn -> fra,
    fr_XX -> fr, zh-Hant -> zh), as ISO 639-1 where the table has it (fra -> fr); a code that
    starts otherwise is returned case-folded."""
    m = CODE.match(code.strip().strip("<>").lstrip("_2"))
    if m is None:
        return code.casefold()
    base = m.group(0).casefold()
    return ISO3_TO_1.get(base, base)


def codes_for(language: str, codes: tuple[str, ...] | list[str]) -> list[str]:
    """The model's codes that name `language` (an ISO 639-1 code, as the identifier reports it)."""
    return [c for c in codes if base_language(c) == language]
