"""A directory of bundles where a command runs one bundle (`xform corpus DIR`): the bundle the
route picks for --src-lang / --tgt-lang (runtime/fleet/routes.one_hop), chosen once for the job."""
from __future__ import annotations

from pathlib import Path

from xform.cli import err


def routed_bundle(bundle: Path, src_lang: str | None, tgt_lang: str | None) -> tuple[Path, str | None, str | None]:
    """`bundle`, `src_lang`, `tgt_lang` as given for one bundle; for a directory of bundles, the
    one its route takes and the languages as that bundle is asked for them (a fairseq model's
    codes; none for a pair bundle, which translates one way)."""
    from xform.runtime.fleet.catalog import Catalog, holds_bundles
    from xform.runtime.fleet.routes import one_hop
    if not holds_bundles(bundle):
        return bundle, src_lang, tgt_lang
    catalog = Catalog.scan(bundle)
    hop = one_hop(catalog, src_lang, tgt_lang)
    path = catalog[hop.model].path
    err.print(f"route: {hop} ({path}), chosen for the whole corpus", markup=False)
    return path, hop.asked.src_lang, hop.asked.tgt_lang
