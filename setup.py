"""The package metadata is in pyproject.toml; this only puts the files that live at the repository
root but are read at run time (the migrations, the sample plan config) inside the built package,
so that a non-editable install finds them (service.config.shipped)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("migrations", "plans.toml")


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads them where they are
            return
        target = Path(self.build_lib) / "service"
        for name in SHIPPED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, target / name, dirs_exist_ok=True)
            else:
                shutil.copy2(source, target / name)


setup(cmdclass={"build_py": BuildPy})
