# JupyterLab with labkit, from the same pins as the local setup (pyproject.toml, jvm/pom.xml).
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless maven make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /lab
COPY . /lab
RUN pip install --no-cache-dir -e '.[dev]' && labkit setup
EXPOSE 8888
# Inside the container Jupyter must listen on all interfaces; compose publishes it on 127.0.0.1.
CMD ["jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser", "--allow-root", \
     "--ServerApp.token=", "--notebook-dir=/lab/notebooks"]
