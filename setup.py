"""One wheel, both halves of the package: the library (``src/linkescape``) and its tools
(``tools/linkescape``, which join the package's path in a source checkout: ``linkescape.__init__``).
An editable install needs nothing more; a wheel gets the tools' files beside the library's."""

import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

TOOLS = pathlib.Path(__file__).resolve().parent / "tools" / "linkescape"


class BuildBothHalves(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return  # src/linkescape/__init__.py finds the tools' half in the checkout
        for path in sorted(TOOLS.rglob("*.py")):
            dest = pathlib.Path(self.build_lib) / "linkescape" / path.relative_to(TOOLS)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)


setup(cmdclass={"build_py": BuildBothHalves})
