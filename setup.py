"""Build hook: generate the protobuf/gRPC stubs from proto/ before packaging."""

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithProto(build_py):
    def run(self):
        import importlib.util
        import pathlib

        here = pathlib.Path(__file__).resolve().parent
        spec = importlib.util.spec_from_file_location("_meshrl_pb_gen", here / "services/pb/_gen.py")
        gen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(gen)
        if gen.needs_generation(here / "proto", here / "services/pb"):
            gen.generate(here / "proto", here / "services/pb")
        super().run()


setup(cmdclass={"build_py": BuildPyWithProto})
