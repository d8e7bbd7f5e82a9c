from tests.bench.fake_openai import server  # noqa: F401 (the fake OpenAI server fixture)
