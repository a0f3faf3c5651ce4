"""The documentation site (mkdocs.yml, docs/, the reference written by docs/hooks/reference.py), built strictly:

- the generated reference has a page for every registered problem and algorithm, with each declared parameter
  and metric, and every recipe field and CLI command and option: compared with the registries themselves;
- a `Param` added in code appears on the built site with no page edited;
- the Python API (issue 47 item 7): a page per topic, generated from the docstrings by mkdocstrings and linked from
  the tutorials, and every name a page shows has a docstring (a name without one fails the build);
- in headless Chromium (as tests/cli/test_browser.py), served over HTTP with no network beyond localhost: the home
  page leads to the tutorial, an algorithm's page opens, and the search box finds it; nothing is fetched from
  outside the site (no web fonts, no CDN); at 1280-1600 px wide no code block is clipped or under its copy
  button, the gallery's figures are legible and no sidebar link is cut (docs/stylesheets/extra.css).
"""
from __future__ import annotations

import functools
import html
import importlib
import importlib.util
import os
import re
import shutil
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fedbench.algorithms import ALGORITHMS
from fedbench.hparams import Param
from fedbench.problems import PROBLEMS

ROOT = Path(__file__).resolve().parents[2]
NO_MKDOCS = "mkdocs is not installed (pip install -e '.[docs]')" if importlib.util.find_spec("mkdocs") is None else ""

# A build of the whole site takes ~2 s of a test (measured on 2 busy cores): none is `heavy`.
pytestmark = pytest.mark.skipif(bool(NO_MKDOCS), reason=NO_MKDOCS)


def build_site(site: Path, docs: Path = ROOT / "docs") -> Path:
    """`mkdocs build --strict` of the repository's site (or of the pages in `docs`) into `site`, in this process (so
    that what a test registers in the registries is what the hook reads). A warning (a broken link, a missing
    anchor) raises."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    config = load_config(config_file=str(ROOT / "mkdocs.yml"), site_dir=str(site), docs_dir=str(docs), strict=True)
    cwd = os.getcwd()
    os.chdir(ROOT)  # the hook's path in mkdocs.yml is relative to the repository
    try:
        build(config)
    finally:
        os.chdir(cwd)
    return site


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return build_site(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def hook():
    """docs/hooks/reference.py as a module (the build loads its own instance)."""
    spec = importlib.util.spec_from_file_location("reference_hook", ROOT / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def page(site: Path, path: str) -> str:
    file = site / path / "index.html"
    assert file.exists(), f"no page {path}"
    return file.read_text()


def has_code(text: str, name: str) -> bool:
    return f"<code>{html.escape(name, quote=False)}</code>" in text


def plain(text: str) -> str:
    """A page's text without its tags, every run of white space one space."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", text)).split())


# -- the reference against the registries ----------------------------------------------------------------------

def test_every_algorithm_has_a_page_with_each_hyperparameter_and_its_update_rule(site):
    index = page(site, "reference")
    for name, cls in ALGORITHMS.items():
        text = page(site, f"reference/algorithms/{name}")
        missing = [p.name for p in cls.hparams if not has_code(text, p.name)]
        assert not missing, (name, missing)
        assert "What it requires" in text and "Update rule" in text, name
        assert f'href="algorithms/{name}/"' in index, name


def test_every_problem_has_a_page_with_each_parameter_preset_and_metric(site):
    index = page(site, "reference")
    for name, cls in PROBLEMS.items():
        text = page(site, f"reference/problems/{name}")
        missing = [p.name for p in cls.params if not has_code(text, p.name)]
        missing += [preset for preset in cls.presets if not has_code(text, preset)]
        configs = [cls.resolve_config({"preset": preset}) for preset in cls.presets] or [cls.resolve_config({})]
        missing += [m.name for config in configs for m in cls.declared_metrics(config, personal=True)
                    if not has_code(text, m.name)]
        assert not missing, (name, missing)
        assert f'href="problems/{name}/"' in index, name


def test_every_recipe_field_is_on_the_schema_page(site, hook):
    from sweeps.recipe.schema import SECTIONS
    from sweeps.recipe.trials import FEDERATION_PARAMS

    text = page(site, "reference/recipe")
    for path, model in SECTIONS.items():
        heading = ".".join(path) + ":" if path else "Top level"
        assert html.escape(heading, quote=False) in text, heading
        missing = [field for field in model.model_fields if not has_code(text, field)]
        assert not missing, (path, missing)
    assert not [p.name for p in FEDERATION_PARAMS if not has_code(text, p.name)]
    # every field says what it holds, in a comment beside it in schema.py, which the page shows
    for path, model in SECTIONS.items():
        comments = hook.field_comments(model)
        assert not [field for field in model.model_fields if not comments.get(field)], path
    assert "every configuration runs on each" in text and "rounds every trial runs before it may be stopped" in text


def test_every_cli_command_and_option_is_on_the_cli_page(site):
    import typer.main

    from cli import app

    text = page(site, "reference/cli")
    group = typer.main.get_command(app)
    assert set(group.commands) >= {"run", "sweep", "tune", "report", "validate", "list", "recipes", "ui"}
    for name, command in group.commands.items():
        assert has_code(text, f"fedbench {name}"), name
        missing = [option for param in command.params for option in (*param.opts, *param.secondary_opts)
                   if param.param_type_name == "option" and not has_code(text, option)]
        assert not missing, (name, missing)


def test_every_shipped_paper_recipe_is_in_the_gallery_with_its_command(site):
    from sweeps.shipped import names

    gallery = "".join(file.read_text() for file in (site / "gallery").rglob("index.html"))
    missing = [name for name in names() if name.startswith("papers/")  # the command, alone or with its options
               and not re.search(rf"<code>fedbench sweep {re.escape(name)}[ <]", gallery)]
    assert not missing, missing
    for paper in ("bao2022", "guo2023", "pfedfbe", "hanzely2023", "fallah2020"):
        text = page(site, f"gallery/{paper}")
        assert "What holds" in text and "What did not reproduce" in text and "Time on 2 cores" in text, paper
        assert '<img alt="' in text, paper  # its figure


def test_every_declared_deviation_is_on_its_papers_gallery_page(site):
    """What did not reproduce is written from sweeps/deviations.py: each declared deviation, its values as declared
    and the test that measures it."""
    from sweeps.deviations import DEVIATIONS

    for key, deviation in DEVIATIONS.items():
        text = html.unescape(page(site, f"gallery/{deviation.paper}"))
        section = text[text.index('id="what-did-not-reproduce"'):]
        assert f"<code>{deviation.test}</code>" in section and deviation.claim in section, key
        for name, value in deviation.measured.items():
            assert f"{name} {value}".replace(" -", " −") in section, (key, name)


def test_a_param_added_in_code_appears_on_the_site_with_no_page_edited(tmp_path, monkeypatch):
    fedavg = ALGORITHMS["fedavg"]
    added = Param("probe_momentum", "float", 0.25, "a parameter only this test declares", low=0, high=1)
    monkeypatch.setattr(fedavg, "hparams", (*fedavg.hparams, added))
    text = page(build_site(tmp_path / "site"), "reference/algorithms/fedavg")
    assert has_code(text, "probe_momentum") and "a parameter only this test declares" in text
    assert "<code>0.25</code>" in text and "[0, 1]" in text  # its default and range


def test_a_federation_axis_the_catalogue_gains_is_in_fedbench_list_and_on_the_schema_page(hook, monkeypatch):
    """`fedbench list` and the reference's recipe page read one catalogue (`sweeps.catalogue.entries`): a mapping
    registered in `fedbench.axes.registry.AXES`, as a new axis of the federation would be, is listed and documented, with its
    fields, with no page edited (issue 61: the hook wrote its own list of the axes)."""
    from fedbench.axes.registry import AXES, Mapped
    from fedbench_sweeps.catalogue import listing

    class Probe:
        params = (Param("probe_rate", "float", 0.5, "a field only this test declares", low=0, high=1),)

    monkeypatch.setitem(AXES, "probe_axis", Mapped("probe_axis", Probe, "{probe_rate: 0.5}"))
    lines, unknown = listing(["federation.probe_axis"], 120, "fedbench")
    assert not unknown and "probe_rate: float = 0.5" in "\n".join(lines), lines
    text = hook.recipe_page()
    assert "| `probe_rate` | float | `0.5` | [0, 1] | a field only this test declares |" in text
    sections = [text.index(f"## `federation.{name}`") for name in ("server_optimizer", "probe_axis", "uplink")]
    assert sections == sorted(sections), sections  # after the mappings written before it, before the links


# -- the Python API ----------------------------------------------------------------------------------------------

# What each page must show (a heading of its own, by the object's path), beyond what the hook lists
API_NAMES = {"algorithm": ["Algorithm.client_step", "Algorithm.client_final", "Algorithm.server_update",
                           "Algorithm.downloads", "Algorithm.requires", "Round",
                           "Round.draw", "Round.client_steps", "Upload"],
             "problem": ["Problem.gather", "Problem.minibatch_loss", "FullDataOracles.client_loss", "ProblemSpec.provides",
                         "ProblemSpec.check", "ClientRows.draw_minibatches", "CONTRACT"],
             "oracles": ["Oracle.grad", "Batches", "Minibatch"],
             "parameters": ["Param", "Param.kind", "Metric.direction"],
             "schedules": ["Cosine", "Schedule.value", "PerRound.value", "make"],
             "running": ["run", "simulate", "Result.final", "Simulation.run_round", "RunRecord.accountant"],
             "privacy": ["Accountant.epsilon", "Mechanism.of", "Mechanism.event"],
             "transforms": ["Transform.apply", "Transform.bits", "Compressor.compress", "chain"],
             "participation": ["Participation", "LocalSteps", "check_participation", "sample_clients"],
             "server_optimizers": ["ServerOptimizer", "ServerOptimizer.values", "check_algorithm", "ServerSteps.step"],
             "plugins": ["load", "discover", "PluginError"],
             "partitions": ["split", "Partition.describe", "fingerprint"],
             "images": ["load", "normalize", "random_crop_flip"],
             "networks": ["NETWORKS", "Shipped.build", "load_network", "check_module"]}


def test_the_api_has_a_page_per_topic_with_each_object_linked_from_the_index_and_the_tutorials(site, hook):
    index = page(site, "reference")
    assert set(API_NAMES) == set(hook.API_PAGES)
    for slug, api in hook.API_PAGES.items():
        text = page(site, f"reference/api/{slug}")
        assert f'href="api/{slug}/"' in index, slug
        anchors = set(re.findall(r'id="(fedbench[\w.]*)"', text))
        missing = [name for name in API_NAMES[slug] if not any(a.endswith("." + name) for a in anchors)]
        missing += [path for path in api.objects if path not in anchors]
        assert not missing, (slug, missing)
        opening = importlib.import_module(api.module).__doc__.split()[:6]
        assert " ".join(opening) in plain(text), slug  # the module's docstring opens the page
    for tutorial, slugs in (("tutorials/compare-your-own-method", ("algorithm", "oracles", "parameters", "plugins")),
                            ("how-to/write-a-problem", ("problem",))):
        text = page(site, tutorial)
        assert not [slug for slug in slugs if f"reference/api/{slug}/" not in text], tutorial


def test_every_shipped_network_is_in_the_reference_index_with_its_count_input_and_source(site):
    from fedbench.networks import NETWORKS

    index = plain(page(site, "reference"))
    for name, network in NETWORKS.items():
        shape = "×".join(map(str, network.input_shape))
        assert f"{name} {network.parameters:,} {shape} {network.classes} {network.source}" in index, name
    assert 'href="../guide/networks/"' in page(site, "reference")


def test_the_facts_of_the_plugin_interface_are_on_the_api_pages(site):
    """Issue 47 item 7: what only the SCAFFOLD listing told (the shapes, the defaults, what is written back)."""
    algorithm, problem = plain(page(site, "reference/api/algorithm")), plain(page(site, "reference/api/problem"))
    assert "row [r, k] is the state of client rnd.clients[r, k]" in algorithm  # what `rows` is
    assert "written back into the sampled clients' rows" in algorithm  # client_final's second dict
    assert 'the model server["w"] alone' in algorithm and 'Default: server["w"]' in algorithm
    assert "downloads: tuple[str, ...] = ('w',)" in algorithm  # its default, as the signature shows it
    assert "requires: frozenset[str] = frozenset()" in algorithm
    assert "floats [R, 1, 1]" in algorithm and "a [R, 1, 1] tensor" in algorithm
    assert "client_loss(w: Tensor, clients: Tensor) -> Tensor" in problem and "h is not included" in problem
    assert 'provides = ("full_data",)' in problem
    assert "must accept row −1" in problem  # gather, clients of unequal size


def test_every_public_name_on_the_api_pages_has_a_docstring(hook):
    package = hook.load_api()
    for slug, api in hook.API_PAGES.items():
        shown = hook.documented(api, package)
        assert len(shown) > len(api.objects), slug  # the module, its objects, and members
        assert not hook.undocumented(shown), slug


def test_a_name_without_a_docstring_fails_the_check_and_the_build(hook, tmp_path, monkeypatch, caplog):
    """mkdocstrings leaves out a member without a docstring, silently: the hook's check names it, and the strict
    build fails on it."""
    import griffe
    from mkdocs.exceptions import Abort

    package = hook.load_api()
    package["algorithms.base.Algorithm.client_step"].docstring = None  # a hook's docstring removed
    package["oracle.Batches"].docstring = griffe.Docstring("   ")  # an object's, left blank
    found = [path for api in hook.API_PAGES.values() for path in hook.undocumented(hook.documented(api, package))]
    assert found == ["fedbench.algorithms.base.Algorithm.client_step", "fedbench.oracle.Batches"]

    load = griffe.load

    def without_docstring(*args, **kwargs):
        loaded = load(*args, **kwargs)
        loaded["problems.base.Problem.gather"].docstring = None
        return loaded

    monkeypatch.setattr(griffe, "load", without_docstring)  # what the build's hook loads
    with pytest.raises(Abort, match="1 warning"):
        build_site(tmp_path / "site")
    assert "reference/api/problem.md: fedbench.problems.base.Problem.gather has no docstring" in caplog.text


def test_the_strict_build_fails_on_a_broken_link(tmp_path):
    from mkdocs.exceptions import Abort

    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    build_site(tmp_path / "unchanged", docs)  # the copy builds: what fails below is the one broken link
    (docs / "how-to" / "gpu.md").write_text("# Run on a GPU\n\nSee [the old page](../guide/gpus.md).\n")
    with pytest.raises(Abort, match="warning"):
        build_site(tmp_path / "site", docs)


# -- in a browser ---------------------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BROWSER_MISSING = ("playwright is not installed (pip install -e '.[test]')"
                   if importlib.util.find_spec("playwright") is None
                   else None if Path(CHROMIUM).exists()
                   else "no Chromium at /usr/bin/chromium or on PATH: install Debian's `chromium` package (.ci/run does)")
# The flags of a quiet, self-contained headless Chromium on a machine with no network beyond localhost.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@pytest.fixture
def served(site):
    """The built site over HTTP on a free local port (Material's search runs in a web worker: not from file://)."""
    handler = functools.partial(type("Quiet", (SimpleHTTPRequestHandler,), {"log_message": lambda *a: None}),
                                directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module's tests (a launch costs seconds on 2 busy cores); each test has its page."""
    if BROWSER_MISSING:  # CI (FEDBENCH_REQUIRE_BROWSER=1, set by .ci/run) must run these tests, not skip them
        if os.environ.get("FEDBENCH_REQUIRE_BROWSER") == "1":
            raise RuntimeError(BROWSER_MISSING)
        pytest.skip(BROWSER_MISSING)
    from playwright import sync_api

    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def browser_page(browser, tmp_path):
    view = browser.new_page(viewport={"width": 1400, "height": 1000})
    yield view
    view.screenshot(path=str(tmp_path / "last.png"), full_page=False)
    print(f"screenshot: {tmp_path / 'last.png'}")
    view.close()


@pytest.mark.browser
def test_the_site_leads_from_home_to_the_tutorial_and_finds_an_algorithm_by_search(served, browser_page):
    view = browser_page
    outside = []
    view.on("request", lambda request: None if request.url.startswith(served) or request.url.startswith("data:")
            else outside.append(request.url))

    view.goto(f"{served}/")
    view.locator(".md-content").get_by_role("link", name="compare your own method").first.click()
    view.wait_for_url(f"{served}/tutorials/compare-your-own-method/")
    assert view.locator("h1").inner_text().startswith("Compare your own method")
    assert view.get_by_text("my_method.py").first.is_visible()  # the file's titled code block

    view.goto(f"{served}/reference/")
    view.locator(".md-content a[href='algorithms/scaffold/']").click()
    view.wait_for_url(f"{served}/reference/algorithms/scaffold/")
    assert view.locator("h1").inner_text().startswith("Algorithm scaffold")
    assert view.get_by_text("stochastic controlled averaging").first.is_visible()  # its docstring, the update rule
    assert view.locator("table code", has_text="control").first.is_visible()

    view.goto(f"{served}/")
    search = view.locator("input.md-search__input")
    search.click()
    # the index loads in a web worker: a query typed before it is ready may go unanswered
    view.wait_for_function("() => !document.querySelector('.md-search-result__meta').textContent"
                           ".includes('Initializing')", timeout=30_000)
    search.press_sequentially("scaffold", delay=30)  # typed: the box searches on key events
    result = view.locator(".md-search-result__link[href*='reference/algorithms/scaffold/']").first
    result.wait_for(timeout=30_000)
    result.click()
    view.wait_for_url(f"{served}/reference/algorithms/scaffold/**")
    assert view.locator("h1").inner_text().startswith("Algorithm scaffold")
    assert not outside, f"the site fetched from outside itself: {outside}"


# What each page is checked for at each width (issue 59 item 12): in the content column of ~700 px the code blocks
# scrolled (their lines' ends hidden), the copy button covered the end of a block's first line, the gallery's
# figures were ~150 px wide, and the sidebar's sticky title half hid the link scrolled under it.
READABLE_PAGES = ["", "how-to/write-a-problem/", "tutorials/compare-your-own-method/", "guide/recipes/", "gallery/",
                  "gallery/bao2022/", "reference/api/problem/"]
LEGIBLE_FIGURE = 480  # px: the gallery's 2 × 2 panels with their axis labels readable
READABILITY = """() => {
  const overlaps = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const blocks = [...document.querySelectorAll('.md-content pre > code')];
  const clipped = blocks.filter(code => code.scrollWidth > code.clientWidth)
    .map(code => code.textContent.split('\\n')[0].slice(0, 60));
  const covered = blocks.filter(code => {
    const button = code.parentElement.querySelector('.md-code__button');
    if (!button) return false;
    const range = document.createRange();
    range.selectNodeContents(code);
    return [...range.getClientRects()].some(line => line.width > 0 && overlaps(line, button.getBoundingClientRect()));
  }).map(code => code.textContent.split('\\n')[0].slice(0, 60));
  const figures = [...document.querySelectorAll('.md-content img')].map(img => img.getBoundingClientRect().width);
  const sidebar = document.querySelector('.md-sidebar--primary .md-sidebar__scrollwrap');
  let edge = sidebar.getBoundingClientRect().top;
  const title = document.querySelector('.md-sidebar--primary .md-nav--primary > .md-nav__title');
  if (title && title.getClientRects().length) edge = Math.max(edge, title.getBoundingClientRect().bottom);
  const cut = [...sidebar.querySelectorAll('.md-nav__link')].filter(link => {
    const box = link.getBoundingClientRect();
    return box.height > 0 && box.top < edge - 1 && box.bottom > edge + 1;
  }).map(link => link.textContent.trim());
  return {blocks: blocks.length, clipped, covered, figures, cut};
}"""


@pytest.mark.browser
@pytest.mark.parametrize("width", [1280, 1400, 1600])
def test_the_site_is_readable_at_desktop_widths(served, browser_page, width, tmp_path):
    """Issue 59 item 12, in Chromium at 1280, 1400 and 1600 × 1000 px, on pages of long code, figures and a deep
    sidebar: no code block scrolls (its lines wrap in the wider column), no code under a block's copy button, the
    gallery's figures at least LEGIBLE_FIGURE px wide, and no sidebar link cut at the sidebar's top. Each page's
    screenshot is written to tmp_path."""
    view = browser_page
    view.set_viewport_size({"width": width, "height": 1000})
    seen = {}
    for path in READABLE_PAGES:
        view.goto(f"{served}/{path}")
        view.wait_for_timeout(200)  # Material scrolls the sidebar to the page's link after the load
        seen[path or "home"] = view.evaluate(READABILITY)
        view.screenshot(path=str(tmp_path / f"{width}-{(path or 'home').strip('/').replace('/', '-')}.png"))
    print(f"screenshots: {tmp_path}")
    assert sum(found["blocks"] for found in seen.values()) > 100  # the pages' code blocks were looked at
    faults = {page: {check: found[check] for check in ("clipped", "covered", "cut") if found[check]}
              for page, found in seen.items()}
    faults["gallery/"]["figures"] = [w for w in seen["gallery/"]["figures"] if w < LEGIBLE_FIGURE]
    assert len(seen["gallery/"]["figures"]) == 6
    assert not any(fault for page in faults.values() for fault in page.values()), (width, faults)


LISTED = {"algorithms": ["fedmid", "fast_fedda", "c_fedda", "pfedme"],
          "problems": ["lasso", "lowrank", "digits", "pfl_synthetic", "pfl_images"]}


@pytest.mark.parametrize("kind, name", [(kind, name) for kind, names in LISTED.items() for name in names])
def test_a_docstrings_bullet_list_is_a_list_on_its_reference_page(site, kind, name):
    """Issue 47 item 11: these pages' docstring lists (`* bao — ...` after a line of text) rendered as one
    paragraph, Markdown wanting a blank line before a list. Each bullet line of the docstring is an item now."""
    import inspect as inspect_

    from fedbench.algorithms import ALGORITHMS
    from fedbench.problems import PROBLEMS

    cls = (ALGORITHMS if kind == "algorithms" else PROBLEMS)[name]
    doc = inspect_.cleandoc(inspect_.getmodule(cls).__doc__)
    bullets = [line for line in doc.splitlines() if line.startswith(("* ", "- "))]
    assert bullets, name
    assert page(site, f"reference/{kind}/{name}").count("<li>") >= len(bullets), name
