"""python -m sglfleet_testing.lab up|down|status|driver (and serve, what the daemon runs)."""

from __future__ import annotations

import argparse
import sys

from .container import LxcError, LxcHost
from .driver import DriverError, build_installer, declare_module, declared_module
from .node import declare_node_driver, declare_node_gpus, reboot_node
from .service import LabError, down, serve, status, up
from .settings import LabSettings
from .template import TemplateError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglfleet_testing.lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="bring the lab up (a no-op when it is up)")
    down_parser = sub.add_parser("down", help="remove every container, process and file the lab made")
    down_parser.add_argument(
        "--keep-template",
        action="store_true",
        help="keep the downloads: the template (the next `up` skips the debootstrap), the node's .debs",
    )
    sub.add_parser("status", help="say what of the lab runs; exit 0 when it is up, 3 when it is not")
    driver = sub.add_parser(
        "driver",
        help="the stand-in NVIDIA driver: declare the host module version CTs see, build installers",
    )
    driver.add_argument("--module", help="declare this nvidia module version in the CTs' /proc/driver/nvidia")
    driver.add_argument("--no-module", action="store_true", help="declare that no nvidia module is loaded")
    driver.add_argument("--build", metavar="VERSION", help="build NVIDIA-Linux-x86_64-VERSION.run (stand-in)")
    node = sub.add_parser("node", help="the stand-in PVE node (lab container 0): its driver, a reboot")
    node.add_argument("--driver", help="declare this NVIDIA driver version installed on the node")
    node.add_argument("--no-driver", action="store_true", help="declare that the node has no NVIDIA driver")
    node.add_argument("--gpus", type=int, help="declare this many NVIDIA GPUs on the node's PCI bus")
    node.add_argument("--reboot", action="store_true", help="power off, boot with no module loaded")
    sub.add_parser("serve", help="run the PVE bridge in the foreground (what `up` starts as a daemon)")
    args = parser.parse_args(argv)
    settings = LabSettings()
    try:
        if args.command == "up":
            up(settings)
        elif args.command == "down":
            down(settings, keep_template=args.keep_template)
        elif args.command == "status":
            state = status(settings)
            print("\n".join(state.lines()))
            return 0 if state.up else 3
        elif args.command == "node":
            _node(settings, args)
        elif args.command == "driver":
            _driver(settings, args)
        else:
            serve(settings)
    except (LabError, LxcError, TemplateError, DriverError) as e:
        print(f"lab {args.command}: {e}", file=sys.stderr)
        return 1
    return 0


def _node(settings: LabSettings, args: argparse.Namespace) -> None:
    if args.driver or args.no_driver:
        declare_node_driver(settings, None if args.no_driver else args.driver)
    if args.gpus is not None:
        declare_node_gpus(settings, args.gpus)
    if args.reboot:
        reboot_node(settings, LxcHost(settings))


def _driver(settings: LabSettings, args: argparse.Namespace) -> None:
    if args.no_module or args.module:
        declare_module(settings, None if args.no_module else args.module)
    if args.build:
        installer = build_installer(settings, args.build)
        print(f"{installer.path} sha256:{installer.sha256}")
    print(f"declared nvidia module: {declared_module(settings) or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
