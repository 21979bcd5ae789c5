@echo off
rem ==========================================================================
rem  TrainDeck launcher for Windows (twin of train_gpu.sh)
rem
rem    train_gpu.bat                          open the GUI          (python -m gui)
rem    train_gpu.bat --preset cpu-tiny ...    train without the GUI (python -m core.train ...)
rem    train_gpu.bat --test [pytest args]     install the test extras, run the test suite
rem    train_gpu.bat --help
rem
rem  The first run creates .venv next to this file and installs torch (a CUDA
rem  build when nvidia-smi reports an NVIDIA GPU, the CPU build otherwise)
rem  and TrainDeck into it, with triton-windows for torch.compile on an NVIDIA
rem  GPU. Later runs skip that until pyproject.toml changes.
rem  Double-clicking works from any folder; on errors the window stays open.
rem
rem  Environment variables (all optional):
rem    TRAINDECK_PYTHON=C:\path\to\python.exe  interpreter used to create .venv
rem    TRAINDECK_TORCH_VARIANT=cpu or cu128    force a torch build (cpu, cu126, ...)
rem    TRAINDECK_NO_PAUSE=1                    never wait for a key press on errors
rem ==========================================================================
setlocal EnableExtensions DisableDelayedExpansion

rem ---- keep in sync with train_gpu.sh ---------------------------------------
set "TORCH_VERSION=2.13.0"
rem CUDA builds of torch on PyTorch's wheel index, newest first. cuXYZ needs a
rem driver whose nvidia-smi reports "CUDA Version" XY.Z or newer.
set "TORCH_CUDA_BUILDS=cu130 cu128 cu126"
set "TORCH_INDEX_BASE=https://download.pytorch.org/whl"
rem torch.compile on an NVIDIA GPU needs Triton; on Windows that is the package
rem triton-windows, at the Triton minor this torch minor is built with (torch
rem 2.13: Triton 3.7). Linux's CUDA torch brings its own triton.
set "TRITON_WINDOWS=3.7.*"
rem ----------------------------------------------------------------------------

set "RC=0"
rem Remember where this file is before the working folder changes.
set "LAUNCHER=%~nx0"
set "SCRIPT_DIR=%~dp0"

rem ---- work in the folder this file lives in --------------------------------
cd /d "%~dp0" 2>nul
rem pushd also copes with \\server\share folders, which cd cannot enter.
if not exist "pyproject.toml" pushd "%SCRIPT_DIR%" 2>nul
if not exist "pyproject.toml" goto fail_location
set "ROOT=%CD%"
set "VENV=%ROOT%\.venv"
set "VENV_PY=%VENV%\Scripts\python.exe"
set "STAMP=%VENV%\traindeck-install.stamp"

rem ---- what to run ----------------------------------------------------------
set "MODE=cli"
set "EXTRAS="
set "TEST_ARGS="
if "%~1"=="" set "MODE=gui"
if /i "%~1"=="--help" goto usage
if /i "%~1"=="-h" goto usage
if "%~1"=="/?" goto usage
if /i "%~1"=="--test" goto parse_test_args
goto args_done

:parse_test_args
set "MODE=test"
set "EXTRAS=test"
rem Everything after --test goes to pytest, as typed.
set "TEST_ARGS=%*"
set "TEST_ARGS=%TEST_ARGS:*--test=%"
:args_done

rem ---- which torch build ----------------------------------------------------
call :detect_torch_variant
if not "%ERRORLEVEL%"=="0" goto fail

rem ---- virtual environment --------------------------------------------------
if not exist "%VENV%\pyvenv.cfg" goto create_venv
"%VENV_PY%" -c "import sys" >nul 2>&1
if "%ERRORLEVEL%"=="0" goto venv_ready
echo [traindeck] The existing .venv does not work any more - was the Python it was
echo [traindeck] made from uninstalled or moved? Creating it again.
rmdir /s /q "%VENV%" >nul 2>&1
if exist "%VENV%\pyvenv.cfg" goto fail_venv_delete

:create_venv
call :find_python
if not "%ERRORLEVEL%"=="0" goto fail
echo [traindeck] Creating the virtual environment "%VENV%" with: %PY_DESC%
"%PY_EXE%" %PY_ARGS% -m venv "%VENV%"
if not "%ERRORLEVEL%"=="0" goto fail_venv
if not exist "%VENV_PY%" goto fail_venv
rem Python 3.10's bundled pip is too old for editable installs from pyproject.toml.
"%VENV_PY%" -m pip install --upgrade pip
if not "%ERRORLEVEL%"=="0" echo [traindeck] WARNING: could not upgrade pip; continuing with the bundled one.

:venv_ready
rem ---- install unless the stamp says it is done -----------------------------
"%VENV_PY%" -c "import hashlib; print(hashlib.sha256(open('pyproject.toml', 'rb').read()).hexdigest())" >"%VENV%\traindeck-hash.tmp" 2>nul
if not "%ERRORLEVEL%"=="0" goto fail_hash
set "DEPS_HASH="
set /p DEPS_HASH=<"%VENV%\traindeck-hash.tmp"
del "%VENV%\traindeck-hash.tmp" >nul 2>&1
if not defined DEPS_HASH goto fail_hash
set "WANT_STAMP=%DEPS_HASH% torch=%TORCH_VERSION%+%TORCH_VARIANT%"
if defined WANT_CUDA set "WANT_STAMP=%WANT_STAMP% triton-windows=%TRITON_WINDOWS%"
set "HAVE_STAMP="
if exist "%STAMP%" set /p HAVE_STAMP=<"%STAMP%"
if "%HAVE_STAMP%"=="%WANT_STAMP% extras=test" goto deps_up_to_date
if not defined EXTRAS if "%HAVE_STAMP%"=="%WANT_STAMP% extras=" goto deps_up_to_date
goto install

:deps_up_to_date
echo [traindeck] Dependencies up to date (torch %TORCH_VERSION%+%TORCH_VARIANT%) - skipping installation.
goto run

:install
if exist "%STAMP%" del "%STAMP%" >nul 2>&1
echo [traindeck] Installing torch %TORCH_VERSION%+%TORCH_VARIANT% from %TORCH_INDEX_BASE%/%TORCH_VARIANT% - the first time this takes a while ...
"%VENV_PY%" -m pip install "torch==%TORCH_VERSION%+%TORCH_VARIANT%" --index-url "%TORCH_INDEX_BASE%/%TORCH_VARIANT%"
if not "%ERRORLEVEL%"=="0" goto fail_torch
set "PROJECT_SPEC=."
if defined EXTRAS set "PROJECT_SPEC=.[%EXTRAS%]"
echo [traindeck] Installing TrainDeck and its dependencies: pip install -e "%PROJECT_SPEC%"
"%VENV_PY%" -m pip install -e "%PROJECT_SPEC%"
if not "%ERRORLEVEL%"=="0" goto fail_pip
if defined WANT_CUDA call :install_triton
if defined WANT_CUDA goto verify_cuda
"%VENV_PY%" -c "import torch; print('[traindeck] torch', torch.__version__, 'imports fine (CPU build)')"
if not "%ERRORLEVEL%"=="0" goto fail_torch_import
goto write_stamp

:verify_cuda
"%VENV_PY%" -c "import sys, torch as t; ok = t.cuda.is_available(); print('[traindeck] torch', t.__version__, '- CUDA', t.version.cuda, '- GPU usable:', ok); sys.exit(0 if ok else 4 if t.version.cuda else 3)"
set "VERIFY_RC=%ERRORLEVEL%"
if "%VERIFY_RC%"=="0" goto write_stamp
if "%VERIFY_RC%"=="3" goto fail_cpu_torch
if "%VERIFY_RC%"=="4" goto fail_cuda_unusable
goto fail_torch_import

:write_stamp
set "STAMP_LINE=%WANT_STAMP% extras=%EXTRAS%"
>"%STAMP%" echo %STAMP_LINE%
echo [traindeck] Installation complete.

rem ---- run --------------------------------------------------------------------
:run
if "%MODE%"=="gui" goto run_gui
if "%MODE%"=="test" goto run_test
echo [traindeck] Training without the GUI: python -m core.train %*
"%VENV_PY%" -m core.train %*
set "RC=%ERRORLEVEL%"
goto finish

:run_gui
echo [traindeck] Starting the GUI: python -m gui   (command-line training: %LAUNCHER% --help)
"%VENV_PY%" -m gui
set "RC=%ERRORLEVEL%"
goto finish

:run_test
if not defined QT_QPA_PLATFORM if defined CI set "QT_QPA_PLATFORM=offscreen"
echo [traindeck] Running the tests: python -m pytest -q%TEST_ARGS%
"%VENV_PY%" -m pytest -q %TEST_ARGS%
set "RC=%ERRORLEVEL%"
goto finish

rem ==========================================================================
:usage
echo TrainDeck launcher - sets up .venv on first use, then runs TrainDeck.
echo.
echo   %LAUNCHER%                         open the GUI (python -m gui)
echo   %LAUNCHER% [training options]      train without the GUI (python -m core.train ...)
echo   %LAUNCHER% --test [pytest args]    install the test extras and run python -m pytest -q
echo   %LAUNCHER% --help                  this text
echo.
echo Examples:
echo   %LAUNCHER% --preset cpu-tiny --max-steps 5 --out runs\try
echo   %LAUNCHER% --max-epochs 50
echo   %LAUNCHER% --resume latest
echo.
echo The first run installs torch %TORCH_VERSION% - a CUDA build when nvidia-smi finds an
echo NVIDIA GPU, else the CPU build - and TrainDeck into .venv. Delete the .venv folder
echo to start over. Optional: TRAINDECK_PYTHON, TRAINDECK_TORCH_VARIANT=cpu/cu128/...,
echo TRAINDECK_NO_PAUSE=1.
if not exist "%VENV_PY%" goto usage_end
echo.
echo Training options (python -m core.train --help):
"%VENV_PY%" -m core.train --help
:usage_end
exit /b 0

rem ==========================================================================
rem  Subroutines. They return 0 on success, non-zero after printing why.
rem ==========================================================================

:install_triton
rem Without it training still runs, uncompiled: a warning, not a failure.
echo [traindeck] Installing triton-windows %TRITON_WINDOWS% for torch.compile on the GPU ...
"%VENV_PY%" -m pip install "triton-windows==%TRITON_WINDOWS%"
if "%ERRORLEVEL%"=="0" exit /b 0
echo [traindeck] WARNING: installing triton-windows failed (see pip's message above). Training
echo [traindeck] runs uncompiled (slower steps) until it is installed:
echo [traindeck]   "%VENV_PY%" -m pip install "triton-windows==%TRITON_WINDOWS%"
exit /b 0

:detect_torch_variant
set "TORCH_VARIANT=cpu"
set "WANT_CUDA="
if not defined TRAINDECK_TORCH_VARIANT goto detect_gpu
set "TORCH_VARIANT=%TRAINDECK_TORCH_VARIANT%"
if /i "%TORCH_VARIANT%"=="cpu" goto variant_forced
if /i "%TORCH_VARIANT:~0,2%"=="cu" set "WANT_CUDA=1"
if defined WANT_CUDA goto variant_forced
echo [traindeck] ERROR: TRAINDECK_TORCH_VARIANT must be cpu or a CUDA build like cu128, not "%TORCH_VARIANT%".
exit /b 1
:variant_forced
echo [traindeck] Using the torch build TRAINDECK_TORCH_VARIANT=%TORCH_VARIANT% asks for.
exit /b 0

:detect_gpu
set "SMI="
for %%I in (nvidia-smi.exe) do set "SMI=%%~$PATH:I"
if not defined SMI if exist "%ProgramFiles%\NVIDIA Corporation\NVSMI\nvidia-smi.exe" set "SMI=%ProgramFiles%\NVIDIA Corporation\NVSMI\nvidia-smi.exe"
if defined SMI goto run_smi
echo [traindeck] No NVIDIA GPU found (no nvidia-smi) - using the CPU build of torch.
exit /b 0
:run_smi
set "SMI_OUT=%TEMP%\traindeck-nvidia-smi-%RANDOM%.txt"
"%SMI%" >"%SMI_OUT%" 2>&1
if "%ERRORLEVEL%"=="0" goto smi_ok
del "%SMI_OUT%" >nul 2>&1
echo [traindeck] nvidia-smi is installed but reports no working NVIDIA GPU - using the CPU build
echo [traindeck] of torch. If this PC has an NVIDIA GPU, (re)install the driver from
echo [traindeck] https://www.nvidia.com/Download/index.aspx , reboot, and run %LAUNCHER% again.
exit /b 0
:smi_ok
rem The header line looks like
rem   | NVIDIA-SMI 580.65   Driver Version: 580.65   CUDA Version: 13.0   |
rem Keep only the text between the bars: a "|" in a variable is asking for trouble.
set "SMI_LINE="
"%SystemRoot%\System32\find.exe" "CUDA Version" <"%SMI_OUT%" >"%SMI_OUT%.line" 2>nul
for /f "usebackq tokens=1 delims=|" %%L in ("%SMI_OUT%.line") do set "SMI_LINE=%%L"
del "%SMI_OUT%" "%SMI_OUT%.line" >nul 2>&1
set "GPU_NAME="
"%SMI%" --query-gpu=name,driver_version --format=csv,noheader >"%SMI_OUT%" 2>nul
set /p GPU_NAME=<"%SMI_OUT%"
del "%SMI_OUT%" >nul 2>&1
set "CUDA_VERSION="
if defined SMI_LINE set "CUDA_VERSION=%SMI_LINE:*CUDA Version:=%"
if defined CUDA_VERSION for /f "tokens=1" %%V in ("%CUDA_VERSION%") do set "CUDA_VERSION=%%V"
set "CUDA_MAJOR="
set "CUDA_MINOR=0"
if defined CUDA_VERSION for /f "tokens=1,2 delims=." %%A in ("%CUDA_VERSION%") do (set "CUDA_MAJOR=%%A" & set "CUDA_MINOR=%%B")
if not defined CUDA_MAJOR goto cuda_unknown
rem Both parts must be plain numbers ("N/A" turns into 0 and fails the test).
set /a "CHECK_NUM=CUDA_MAJOR" 2>nul
if not "%CHECK_NUM%"=="%CUDA_MAJOR%" goto cuda_unknown
set /a "CHECK_NUM=CUDA_MINOR" 2>nul
if not "%CHECK_NUM%"=="%CUDA_MINOR%" goto cuda_unknown
set /a "CUDA_NUM=CUDA_MAJOR*100+CUDA_MINOR"
echo [traindeck] Found NVIDIA GPU: %GPU_NAME% - driver supports CUDA %CUDA_VERSION%
set "OLDEST_BUILD="
for %%B in (%TORCH_CUDA_BUILDS%) do call :pick_cuda_build %%B
if not "%TORCH_VARIANT%"=="cpu" goto cuda_picked
echo [traindeck] WARNING: this NVIDIA driver is too old for torch %TORCH_VERSION%: it supports CUDA %CUDA_VERSION%,
echo [traindeck] the oldest CUDA build of torch (%OLDEST_BUILD%) needs CUDA %OLDEST_NEED%. Update the driver from
echo [traindeck] https://www.nvidia.com/Download/index.aspx and run %LAUNCHER% again.
echo [traindeck] Continuing with the CPU build of torch - training will run on the CPU (slow).
exit /b 0
:cuda_picked
set "WANT_CUDA=1"
echo [traindeck] Using the CUDA build of torch: %TORCH_VARIANT%
exit /b 0
:cuda_unknown
echo [traindeck] WARNING: nvidia-smi works but its "CUDA Version" could not be read - using the CPU
echo [traindeck] build of torch. Set TRAINDECK_TORCH_VARIANT=cu128 (or cu126/cu130) to choose one.
exit /b 0

:pick_cuda_build
rem %1 = cuXYZ; needs CUDA_NUM >= XY*100+Z. Keeps the first (newest) match.
set "B_NUM=%~1"
set "B_NUM=%B_NUM:cu=%"
set /a "B_NEED=(B_NUM/10)*100+B_NUM%%10"
set "OLDEST_BUILD=%~1"
set /a "B_MAJOR=B_NUM/10"
set /a "B_MINOR=B_NUM%%10"
set "OLDEST_NEED=%B_MAJOR%.%B_MINOR%"
if not "%TORCH_VARIANT%"=="cpu" exit /b 0
if %CUDA_NUM% GEQ %B_NEED% set "TORCH_VARIANT=%~1"
exit /b 0

:find_python
rem Sets PY_EXE / PY_ARGS / PY_DESC to a 64-bit Python 3.10 or newer.
set "PY_EXE="
set "PY_ARGS="
if not defined TRAINDECK_PYTHON goto find_python_search
set "TRAINDECK_PYTHON=%TRAINDECK_PYTHON:"=%"
call :check_python "%TRAINDECK_PYTHON%" ""
if "%ERRORLEVEL%"=="0" exit /b 0
echo [traindeck] ERROR: TRAINDECK_PYTHON is set to "%TRAINDECK_PYTHON%",
echo [traindeck] but that is not a working 64-bit Python 3.10 or newer.
exit /b 1
:find_python_search
for %%V in (3.13 3.12 3.11 3.10) do if not defined PY_EXE call :check_python "py" "-%%V"
if defined PY_EXE exit /b 0
call :check_python "python" ""
if defined PY_EXE exit /b 0
call :check_python "py" "-3"
if defined PY_EXE exit /b 0
set "PY_ON_PATH="
for %%I in (python.exe) do set "PY_ON_PATH=%%~$PATH:I"
if not defined PY_ON_PATH goto no_python
set "PY_NOT_STORE=%PY_ON_PATH:\WindowsApps\=%"
if "%PY_NOT_STORE%"=="%PY_ON_PATH%" goto no_python
echo [traindeck] ERROR: the "python" on your PATH is the Microsoft Store shortcut:
echo [traindeck]   "%PY_ON_PATH%"
echo [traindeck] It only opens the Store; it is not a Python installation TrainDeck can use.
echo [traindeck] Install 64-bit Python 3.12 from https://www.python.org/downloads/windows/
echo [traindeck] (it includes the "py" launcher), or run:  winget install Python.Python.3.12
echo [traindeck] then run %LAUNCHER% again. To stop the shortcut from getting in the way:
echo [traindeck] Settings - Apps - Advanced app settings - App execution aliases - python.exe off.
exit /b 1
:no_python
echo [traindeck] ERROR: no 64-bit Python 3.10 or newer found (tried py -3.13 ... py -3.10, python, py -3).
echo [traindeck] Install Python 3.12 from https://www.python.org/downloads/windows/
echo [traindeck] or run:  winget install Python.Python.3.12
echo [traindeck] then run %LAUNCHER% again. Or set TRAINDECK_PYTHON=C:\path\to\python.exe
exit /b 1

:check_python
rem %1 = program, %2 = its first argument (e.g. -3.12) or "". 0 = usable.
"%~1" %~2 -c "import sys, struct; sys.exit(3 if sys.version_info[:2] < (3, 10) else 4 if struct.calcsize('P') != 8 else 0)" >nul 2>&1
set "CHECK_RC=%ERRORLEVEL%"
if "%CHECK_RC%"=="0" goto check_python_ok
if "%CHECK_RC%"=="3" echo [traindeck] Not using %1 %~2: it is older than Python 3.10.
if "%CHECK_RC%"=="4" echo [traindeck] Not using %1 %~2: it is a 32-bit Python; torch needs 64-bit.
exit /b 1
:check_python_ok
set "PY_EXE=%~1"
set "PY_ARGS=%~2"
set "PY_DESC=%~1 %~2"
exit /b 0

rem ==========================================================================
rem  Failures: say what to do, then go through :fail, which waits for a key.
rem ==========================================================================
:fail_location
echo [traindeck] ERROR: pyproject.toml is not next to %LAUNCHER% in "%SCRIPT_DIR%".
echo [traindeck] Keep %LAUNCHER% in the TrainDeck folder and start it from there.
goto fail

:fail_venv
echo [traindeck] ERROR: could not create the virtual environment "%VENV%".
echo [traindeck] Check that this folder is writable and that "%PY_DESC%" is a complete
echo [traindeck] Python installation (python.org installer), then run %LAUNCHER% again.
if exist "%VENV%" rmdir /s /q "%VENV%" >nul 2>&1
goto fail

:fail_venv_delete
echo [traindeck] ERROR: could not delete the broken "%VENV%" - close programs using it
echo [traindeck] (a running TrainDeck, an editor, a terminal inside it), delete it, try again.
goto fail

:fail_hash
echo [traindeck] ERROR: the Python in "%VENV%" could not read pyproject.toml.
echo [traindeck] Delete the .venv folder and run %LAUNCHER% again.
goto fail

:fail_torch
echo [traindeck] ERROR: installing torch %TORCH_VERSION%+%TORCH_VARIANT% failed (see pip's message above).
echo [traindeck] Check the internet connection (https://download.pytorch.org must be reachable).
if defined WANT_CUDA echo [traindeck] If pip found no matching torch: set TRAINDECK_TORCH_VARIANT=cpu or another CUDA build: %TORCH_CUDA_BUILDS%
goto fail

:fail_pip
echo [traindeck] ERROR: pip install -e "%PROJECT_SPEC%" failed (see pip's message above).
goto fail

:fail_torch_import
echo [traindeck] ERROR: torch was installed but does not import (see the message above).
echo [traindeck] Delete the .venv folder and run %LAUNCHER% again. If it still fails, install the
echo [traindeck] Microsoft Visual C++ Redistributable: https://aka.ms/vs/17/release/vc_redist.x64.exe
goto fail

:fail_cpu_torch
echo [traindeck] ERROR: "Torch not compiled with CUDA enabled": .venv holds a CPU-only torch
echo [traindeck] although an NVIDIA GPU was found. Fix: delete the .venv folder and run %LAUNCHER%
echo [traindeck] again, or run
echo [traindeck]   "%VENV_PY%" -m pip install --force-reinstall "torch==%TORCH_VERSION%+%TORCH_VARIANT%" --index-url %TORCH_INDEX_BASE%/%TORCH_VARIANT%
goto fail

:fail_cuda_unusable
echo [traindeck] ERROR: torch %TORCH_VERSION%+%TORCH_VARIANT% is installed but cannot use the GPU.
echo [traindeck] Update the NVIDIA driver (https://www.nvidia.com/Download/index.aspx), reboot,
echo [traindeck] check that "nvidia-smi" lists the GPU, then run %LAUNCHER% again.
echo [traindeck] To train on the CPU meanwhile: set TRAINDECK_TORCH_VARIANT=cpu
goto fail

:fail
if "%RC%"=="0" set "RC=1"
echo [traindeck] Setup did not finish. Fix the problem above and run %LAUNCHER% again.
goto finish

:finish
if "%RC%"=="0" exit /b 0
echo.
echo [traindeck] %LAUNCHER% ends with exit code %RC%.
if not defined TRAINDECK_NO_PAUSE pause
exit /b %RC%
