"""Build step beside pyproject.toml: a wheel carries the checkout's ``data/`` and ``notebooks/*.ipynb`` as
``kvlab/_shipped/data`` and ``kvlab/_shipped/notebooks``, where ``kvlab.paths`` looks for them, so the CLI and
the notebooks work from a plain ``pip install kvlab-*.whl``. An editable install reads the checkout's own
folders instead and gets no copy. MANIFEST.in puts the same files into an sdist.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = (("data", "**/*"), ("notebooks", "*.ipynb"))  # (folder of the checkout, files of it to carry)


class build_py_with_shipped_files(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        for folder, pattern in SHIPPED:
            files = sorted(p for p in (ROOT / folder).glob(pattern) if p.is_file())
            if not files:
                raise FileNotFoundError(f"setup.py: no {folder}/{pattern} in {ROOT} to put into the wheel")
            for source in files:
                target = Path(self.build_lib, "kvlab", "_shipped", source.relative_to(ROOT))
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)


setup(cmdclass={"build_py": build_py_with_shipped_files})
