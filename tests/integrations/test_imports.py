"""Integrations are adapters nothing imports: optiscope and its command line load neither library."""

import subprocess
import sys


def test_optiscope_imports_no_training_library():
    code = (
        "import sys, optiscope, optiscope.cli, optiscope.experiments.entropy, optiscope.integrations; "
        "loaded = {'transformers', 'peft', 'lightning'} & set(sys.modules); assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
