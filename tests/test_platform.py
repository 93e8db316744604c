from types import SimpleNamespace

import pytest

from utils import platform as plat


def fake_torch(*, cuda=False, hip=None, cuda_ver="12.4", musa=False, xpu=False, mps=False,
               name="GPU", major=9, minor=0, gcn="gfx942:sramecc+:xnack-"):
    props = SimpleNamespace(name=name, major=major, minor=minor, total_memory=80 * 2**30, gcnArchName=gcn)
    dev_api = lambda avail: SimpleNamespace(is_available=lambda: avail, device_count=lambda: 2,  # noqa: E731
                                            get_device_properties=lambda i: props)
    return SimpleNamespace(
        __version__="2.99.0",
        version=SimpleNamespace(cuda=None if hip else cuda_ver, hip=hip, musa="4.0" if musa else None),
        cuda=dev_api(cuda), musa=dev_api(musa), xpu=dev_api(xpu),
        backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: mps)),
    )


def test_cuda():
    rec = plat.detect_platform(fake_torch(cuda=True, name="NVIDIA H200"))
    assert (rec.backend, rec.vendor, rec.device, rec.arch) == ("cuda", "NVIDIA", "cuda", "sm_90")
    assert rec.runtime_version == "CUDA 12.4"
    assert rec.device_count == 2 and rec.memory_bytes == 80 * 2**30
    assert rec.torch_version == "2.99.0"


def test_rocm_is_told_apart_from_cuda():
    rec = plat.detect_platform(fake_torch(cuda=True, hip="6.2.1", name="AMD Instinct MI300X"))
    assert (rec.backend, rec.vendor, rec.device, rec.arch) == ("rocm", "AMD", "cuda", "gfx942")
    assert rec.runtime_version == "HIP 6.2.1"


def test_musa():
    rec = plat.detect_platform(fake_torch(musa=True, name="MTT S4000", major=2, minor=2))
    assert (rec.backend, rec.vendor, rec.device, rec.arch) == ("musa", "Moore Threads", "musa", "mp_22")


def test_xpu_mps_cpu():
    assert plat.detect_platform(fake_torch(xpu=True)).backend == "xpu"
    assert plat.detect_platform(fake_torch(mps=True)).backend == "mps"
    rec = plat.detect_platform(fake_torch())
    assert rec.backend == "cpu" and rec.device == "cpu" and not rec.is_gpu
    assert any("GPU ceilings need a GPU" in n for n in rec.notes)


def test_real_machine_record_is_complete():
    rec = plat.detect_platform().as_dict()
    assert rec["backend"] in plat.BACKENDS
    assert rec["torch_version"] and rec["python_version"]


def test_resolve_device():
    cpu = plat.detect_platform(fake_torch())
    gpu = plat.detect_platform(fake_torch(cuda=True))
    rocm = plat.detect_platform(fake_torch(cuda=True, hip="6.2"))
    assert plat.resolve_device("auto", cpu) == "cpu"
    assert plat.resolve_device("auto", gpu) == "cuda"
    assert plat.resolve_device("cuda:1", gpu) == "cuda:1"
    assert plat.resolve_device("rocm", rocm) == "cuda"
    assert plat.resolve_device("cpu", gpu) == "cpu"
    with pytest.raises(RuntimeError, match="this machine's torch sees cpu"):
        plat.resolve_device("cuda", cpu)
    with pytest.raises(ValueError, match="not one of"):
        plat.resolve_device("tpu", cpu)
