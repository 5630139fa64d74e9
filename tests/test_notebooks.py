"""The notebooks execute end to end on CPU (each in well under two minutes)."""
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat", reason="the dev extra installs nbformat")
nbclient = pytest.importorskip("nbclient", reason="the dev extra installs nbclient")

NOTEBOOKS = pathlib.Path(__file__).parent.parent / "notebooks"


def _execute(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)


@pytest.mark.slow
def test_unified_view_notebook_executes_and_shows_the_seeds_claims():
    text = _execute("01_unified_view.ipynb")
    assert "K=4: leave-one-out scale 1.0000   group mean (1/K) scale 0.7500   (K-1)/K = 0.7500" in text
    assert "Dr. GRPO (eq. 21)                               3.0000" in text
    assert "max |grad(clipped) - grad(rho-hat A)| = 0.0" in text


@pytest.mark.slow
def test_biases_notebook_executes_from_the_saved_results():
    text = _execute("02_biases.ipynb")
    assert "direction bias of the 1/|o|-only update" in text
    assert "weight with / without the std division" in text
    assert "weight share over the whole run" in text


@pytest.mark.slow
def test_off_policy_notebook_executes_and_shows_the_exact_costs():
    text = _execute("03_off_policy.ipynb")
    assert "| stale 1 | 1.99e-02 | 0.963 |" in text
    assert "sequence IS                        staleness 4: bias 0.000  cosine +1.000  variance 0.2647" in text
    assert "sequence TIS, C = 2                staleness 4: bias 0.470  cosine +0.910  variance 0.1336" in text
    assert "behaviour ratio (PPO clip vs mu)   staleness 4: bias 1.368  cosine -0.435" in text


@pytest.mark.slow
def test_multi_turn_notebook_executes_and_shows_the_masking_audit():
    text = _execute("04_multi_turn.ipynb")
    assert "RLOO, 1/(K-1) (eq. 14)" in text and "masked: c 1.0000 bias 0.0000   included: c 0.9495 bias 0.1425" in text
    assert "tabular  REINFORCE, observations in the loss: c 1.0000" in text
