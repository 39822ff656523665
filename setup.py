"""Build hook: the wheel carries the top-level ``migrations/*.sql`` as ``recon_dagster/db/migrations/``.

The SQL has one home, the repository's top-level ``migrations/`` (where the design puts it); the
build copies it into the package so that ``recon-dagster migrate`` works from an installed wheel,
where no checkout exists. Everything else about the distribution is declared in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SOURCE = Path(__file__).resolve().parent / "migrations"
# Must agree with recon_dagster.db.migrate.packaged_migrations_dir().
PACKAGED = ("recon_dagster", "db", "migrations")


class build_py_with_migrations(build_py):  # setuptools' command naming
    def run(self) -> None:
        super().run()
        # An editable install reads the checkout's migrations/ in place; copying would only add a
        # second, stale-able copy.
        if getattr(self, "editable_mode", False):
            return
        files = sorted(SOURCE.glob("*.sql"))
        if not files:
            raise SystemExit(f"no migrations to package: {SOURCE} holds no *.sql")
        target = Path(self.build_lib, *PACKAGED)
        self.mkpath(str(target))
        for sql in files:
            self.copy_file(str(sql), str(target / sql.name))


setup(cmdclass={"build_py": build_py_with_migrations})
