"""What the test suites share: fakes, builders and runners that more than one test module
uses. Test modules import from here, never from one another."""
