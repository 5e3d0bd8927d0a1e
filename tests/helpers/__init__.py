"""What more than one test module uses: fixtures (registered in tests/conftest.py), data builders, stand-ins and
waits. No test module imports another; tests/house/test_test_layout.py holds them to it."""
